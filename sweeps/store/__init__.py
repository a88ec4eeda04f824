"""Where results live: the per-sweep Parquet sink (``sink``) and its schema (``results``),
local and object storage (``storage``), HMAC-signed files (``signing``), what a resume may
trust (``trust``) and the run lock on object storage (``lease``)."""

from moe_core.lazy import lazy_exports

__all__ = ["Location", "read_rows", "RESULTS_FILE"]
__getattr__, __dir__ = lazy_exports(__name__, {
    "Location": "sweeps.store.storage", "read_rows": "sweeps.store.results",
    "RESULTS_FILE": "sweeps.store.results"})

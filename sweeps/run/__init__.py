"""Running a sweep: the command line (``cli``, ``python -m sweeps.run``), the Ray Tune
driver (``driver``), one trial (``trial``), parents and shared stable runs (``parents``), what
is printed (``console``), the spec guard, a resume bound to its folder (``resume``), pruning
(``prune``, ``health``) and failure records. Exports load lazily: Ray is imported only when a
sweep really starts (not for ``--dry-run``)."""

from moe_core.lazy import lazy_exports

__all__ = ["main", "run_sweep"]
__getattr__, __dir__ = lazy_exports(__name__, {
    "main": "sweeps.run.cli", "run_sweep": "sweeps.run.driver"})

"""The YAML front door: a spec file to a frozen :class:`SweepSpec` (``sweep``), its search
space and bounded ``expr`` arithmetic (``space``), grid points and trial configs (``trials``)
and trial names (``naming``). Torch- and Ray-free."""

from moe_core.lazy import lazy_exports

__all__ = ["SweepSpec", "load_spec", "parse_spec", "SearchSpace"]
__getattr__, __dir__ = lazy_exports(__name__, {
    "SweepSpec": "sweeps.spec.sweep", "load_spec": "sweeps.spec.sweep",
    "parse_spec": "sweeps.spec.sweep", "SearchSpace": "sweeps.spec.space"})

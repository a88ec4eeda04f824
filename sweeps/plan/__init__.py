"""A spec planned: trials, parents and WSD branch groups (``build``), the cost forecast
(``cost``), what each trial asks of the cluster (``resources``, ``devices``) and the check
before launch (``preflight``). Torch- and Ray-free, so ``--dry-run`` stays light."""

from moe_core.lazy import lazy_exports

__all__ = ["SweepPlan", "TrialPlan", "build_plan"]
__getattr__, __dir__ = lazy_exports(__name__, {
    "SweepPlan": "sweeps.plan.build", "TrialPlan": "sweeps.plan.build",
    "build_plan": "sweeps.plan.build"})

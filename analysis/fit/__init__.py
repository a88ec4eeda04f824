"""Fit the seeds' scaling laws (000 §4.1, §5): :mod:`moe_core.scaling.fit`, re-exported here
(the law-driven searcher of ``sweeps`` refits with it, and imports flow analysis → sweeps →
moe_core). CLI (:mod:`analysis.cli`, run by __main__):
``python -m analysis.fit DATA --law NAME [--fix E=0.165] [--loo] [--bootstrap N] [--json]``.
"""

from moe_core.scaling.fit import (  # noqa: F401
    DEFAULT_DELTA,
    FitResult,
    bootstrap_params,
    bootstrap_shared,
    fit,
    fit_shared,
    group_noise_bootstrap,
    group_noise_bootstrap_shared,
    leave_one_out,
    noise_components,
    resample_units,
)
from moe_core.scaling.laws import Points  # noqa: F401

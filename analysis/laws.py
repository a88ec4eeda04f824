"""The seeds' scaling laws (a registry of pure functions): :mod:`moe_core.scaling.laws`, where
the law-driven searcher of ``sweeps`` can use them too (imports flow analysis → sweeps →
moe_core). Re-exported here unchanged."""

from moe_core.scaling.laws import (  # noqa: F401
    LAWS,
    SHORT_NAMES,
    TABLE2,
    Law,
    LogTerms,
    Param,
    Points,
    get_law,
    log_predict_fit,
    register,
)

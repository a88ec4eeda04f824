"""Test seams used by the suite and the demos: fault injection into trials (``faults``) and
trials simulated from a known law (``simulate``)."""

from moe_core.lazy import lazy_exports

__all__ = ["SimulatedStudy", "simulated_trainable", "report_function"]
__getattr__, __dir__ = lazy_exports(__name__, {
    "SimulatedStudy": "sweeps.testing.simulate", "simulated_trainable": "sweeps.testing.simulate",
    "report_function": "sweeps.testing.faults"})

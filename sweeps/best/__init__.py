"""``python -m sweeps.best``: moved to :mod:`analysis.best`; this name forwards to it for one
release (sweeps does not import analysis, so the forward is by name)."""

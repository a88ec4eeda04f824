"""``python -m sweeps.compare``: moved to :mod:`analysis.compare`; this name forwards to it for
one release (sweeps does not import analysis, so the forward is by name)."""

"""Scaling laws of the seeds and their fits: pure math (numpy, scipy), below ``sweeps`` so
that the law-driven searcher and ``analysis`` share one implementation."""

"""``python -m analysis.fit DATA --law NAME [--fix E=0.165] [--loo] [--bootstrap N] [--json]``:
fit one of the seeds' scaling laws (000 §4.1, §5) to a sweep's results. The fits themselves are
:mod:`scaling.fit` (pure numpy/scipy, shared with the law-driven searcher of ``sweeps``); the
command line is :mod:`analysis.cli`, run by ``__main__``.
"""

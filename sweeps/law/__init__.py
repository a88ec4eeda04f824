"""``algorithm: law``: a Ray Tune ``Searcher`` that runs only the trials a scaling-law answer needs.

Modules: ``config`` (the ``law:`` block, :class:`~sweeps.law.config.LawSearchConfig`),
``design`` (pure: the loop :class:`~sweeps.law.design.LawDesign`), ``candidates`` (from the
sweep plan), ``searcher`` (:class:`~sweeps.law.searcher.LawSearcher`, its Ray Tune face; the
only Ray import) and ``report`` (progress and closing lines). The loop:

1. a small space-filling start (greedy maximin in log space over the cheaper half of the
   candidates, ``law.seed_trials`` of them);
2. after each completed batch, refit the law (:func:`scaling.fit.fit`, the fit
   ``analysis`` uses) and bootstrap it by trial (``law.bootstrap`` resamples): the target's
   ``law.ci`` percentile interval;
3. propose the ``law.batch`` candidates that most shrink the target's variance per token spent.
   The expected shrinkage is the linear-Gaussian (ensemble Kalman) update computed from the
   bootstrap ensemble itself: observing ln L at candidate c with noise σ² removes
   Cov(T, ln L̂_c)² / (Var ln L̂_c + σ²) from Var T, where T is the target (ln D*, α3, ln L at a
   point) and L̂_c each resample's prediction at c. This is the first-order expected reduction of
   the interval (no nested refits: one refit per batch), exact for a law linear in its
   parameters; a batch is chosen a package at a time (``LawDesign._best_package``), conditioning
   the ensemble covariance on each pick. Gains are divided by marginal costs in FLOPs (6·N·D):
   the parent's 6·N1·D1 unless a chosen trial already trains that parent, and the trial's
   6·N2·D2 less the WSD stable phase its branch group already trains (sweeps.plan.build); a package
   is a candidate that pays such a shared cost plus the branches that payment serves;
4. stop when the interval's width relative to the estimate is at most ``law.ci_width`` on two
   refits in a row (``CONFIRM``), or after ``law.max_trials`` trials, or when no candidate is
   left.
"""

from moe_core.lazy import lazy_exports

__all__ = ["LawSearchConfig", "LawDesign", "LawSearcher"]
__getattr__, __dir__ = lazy_exports(__name__, {
    "LawSearchConfig": "sweeps.law.config", "LawDesign": "sweeps.law.design",
    "LawSearcher": "sweeps.law.searcher"})

"""``algorithm: law``: a Ray Tune ``Searcher`` that runs only the trials a scaling-law answer needs.

Modules: ``config`` (the ``law:`` block, :class:`~sweeps.law.config.LawSearchConfig`),
``design`` (pure: the loop :class:`~sweeps.law.design.LawDesign`), ``candidates`` (from the
sweep plan), ``searcher`` (:class:`~sweeps.law.searcher.LawSearcher`, its Ray Tune face; the
only Ray import) and ``report`` (progress and closing lines). The loop: a space-filling start;
after each batch a refit and bootstrap of the law (:func:`scaling.fit.fit`, as ``analysis``);
proposals that most shrink the target's variance per FLOP (the linear-Gaussian update from the
bootstrap ensemble, chosen a package at a time); a stop once the interval is narrow on
``CONFIRM`` refits in a row, at ``law.max_trials``, or with no candidate left. docs/law-search.md
gives the rule and its costs in full.
"""

from moe_core.lazy import lazy_exports

__all__ = ["LawSearchConfig", "LawDesign", "LawSearcher"]
__getattr__, __dir__ = lazy_exports(__name__, {
    "LawSearchConfig": "sweeps.law.config", "LawDesign": "sweeps.law.design",
    "LawSearcher": "sweeps.law.searcher"})

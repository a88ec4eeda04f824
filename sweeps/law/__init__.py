"""``algorithm: law``: a Ray Tune ``Searcher`` that runs only the trials a scaling-law answer needs.

Modules: ``config`` (the ``law:`` block, :class:`~sweeps.law.config.LawSearchConfig`),
``design`` (pure: the loop :class:`~sweeps.law.design.LawDesign`), ``candidates`` (from the
sweep plan), ``searcher`` (:class:`~sweeps.law.searcher.LawSearcher`, its Ray Tune face; the
only Ray import) and ``report`` (progress and closing lines). docs/law-search.md gives the loop,
its proposal rule and its costs.
"""

from moe_core.lazy import lazy_exports

__all__ = ["LawSearchConfig", "LawDesign", "LawSearcher"]
__getattr__, __dir__ = lazy_exports(__name__, {
    "LawSearchConfig": "sweeps.law.config", "LawDesign": "sweeps.law.design",
    "LawSearcher": "sweeps.law.searcher"})

"""``algorithm: law``: a Ray Tune ``Searcher`` that runs only the trials a scaling-law answer needs.
docs/design.md gives each module's job (``searcher`` is the only Ray import); docs/law-search.md
the loop, its proposal rule and its costs."""

from moe_core.lazy import lazy_exports

__all__ = ["LawSearchConfig", "LawDesign", "LawSearcher"]
__getattr__, __dir__ = lazy_exports(__name__, {
    "LawSearchConfig": "sweeps.law.config", "LawDesign": "sweeps.law.design",
    "LawSearcher": "sweeps.law.searcher"})

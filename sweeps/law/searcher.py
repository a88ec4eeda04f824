"""``algorithm: law`` as a Ray Tune ``Searcher`` (the law package's only Ray import). Ray Tune does
not carry a searcher's state through ``Tuner.restore`` reliably (ray-project/ray#30861): besides
``save`` / ``restore`` of the whole design, the searcher writes it to ``law_search.json`` next to
the results after every change, which a ``--resume`` reads first (docs/law-search.md).
"""

from __future__ import annotations

import json
import pickle
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ray.tune.search import Searcher

from sweeps.law.algorithm import STATE_FILE, read_law_state
from sweeps.law.design import Candidate, LawDesign
from sweeps.law.report import describe_refit
from sweeps.run import console
from sweeps.store.storage import Location

__all__ = ["STATE_FILE", "LawSearcher", "read_law_state"]


class LawSearcher(Searcher):
    """``algorithm: law`` as a Ray Tune ``Searcher`` (see the module's docstring). Suggests
    candidates' search points; each trial's ``metric`` at its end is the observed loss."""

    def __init__(self, cfg, candidates: Sequence[Candidate], *, metric: str = "val_loss",
                 mode: str = "min", state_dir: str | Path | Location | None = None,
                 seed: int = 0):
        super().__init__(metric=metric, mode=mode)
        self.design = LawDesign(cfg, candidates, seed=seed)
        self.trials: dict[str, int] = {}
        # a local folder or object storage (``sweeps.store.storage``): the state is one small JSON
        self.state_dir = Location.of(state_dir).signed() if state_dir else None  # S3: signed
        if self.state_dir is not None and (state := read_law_state(self.state_dir)) is not None:
            self.set_state(state)
        self._shown = len(self.design.history)
        """Refits already announced (one progress line each)."""

    def set_search_properties(self, metric, mode, config, **spec) -> bool:
        self._metric = metric or self._metric
        self._mode = mode or self._mode
        return True

    def suggest(self, trial_id: str) -> dict[str, Any] | str | None:
        if trial_id in self.trials:  # asked again for a trial it already placed
            return dict(self.design.candidates[self.trials[trial_id]].point)
        i = self.design.take()
        if i is not None:
            self.trials[trial_id] = i
        self.flush()
        if i is None:
            return Searcher.FINISHED if self.design.finished and not self.design.pending \
                else None
        return dict(self.design.candidates[i].point)

    def on_trial_complete(self, trial_id: str, result: dict | None = None,
                          error: bool = False) -> None:
        i = self.trials.get(trial_id)
        if i is None:
            return
        loss = None if error or not result else result.get(self._metric)
        self.design.observe(i, loss if isinstance(loss, (int, float)) else None)
        # Tune asks for no trial past its sample count, so the refit after the last trial
        # happens here, not in suggest()
        self.design.settle()
        self.flush()

    def _announce(self) -> None:
        """A progress line per new refit (the searcher runs in the sweep's driver)."""
        for h in self.design.history[self._shown:]:
            console.progress(describe_refit(self.design.cfg, h, self.design.narrow))
        self._shown = len(self.design.history)

    # ---- state: Tune's save/restore and our own file -------------------------------------

    def get_state(self) -> dict[str, Any]:
        return {"design": self.design.state(), "trials": dict(self.trials)}

    def set_state(self, state: dict[str, Any]) -> None:
        self.design.load_state(state["design"])
        self.trials = dict(state["trials"])

    def save(self, checkpoint_path: str) -> None:
        with open(checkpoint_path, "wb") as f:
            pickle.dump(self.get_state(), f)

    def restore(self, checkpoint_path: str) -> None:
        with open(checkpoint_path, "rb") as f:
            self.set_state(pickle.load(f))

    def flush(self) -> None:
        """Announce refits not yet announced and write the state file."""
        self._announce()
        self._persist()

    def _persist(self) -> None:
        if self.state_dir is None:
            return
        self.state_dir.mkdir()
        # locally a temp file, fsync and rename; on object storage one PUT (atomic per object)
        (self.state_dir / STATE_FILE).write_text(json.dumps(self.get_state(), default=float))


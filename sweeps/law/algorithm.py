"""``algorithm: law`` as a :class:`sweeps.spec.algorithm.Algorithm` plug-in: everything the
sweep does differently for a law search (its checks, its ``--dry-run`` lines, its recorded
settings, the searcher and its saved state, the trials it trains on demand, its summary entry
and closing line). Pure at import: the Ray searcher loads when a sweep builds it."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from moe_core.configio import unknown_key
from moe_core.errors import SearchSpaceError
from moe_core.train.config import TrainConfig
from sweeps.law.candidates import candidates_from_plan
from sweeps.law.config import LawSearchConfig, parse_law_block
from sweeps.law.report import describe_outcome, outcome
from sweeps.plan.build import extends_stable, on_demand_starts
from sweeps.spec.algorithm import Algorithm, load
from sweeps.store.storage import Location

STATE_FILE = "law_search.json"
ADDED = {"widen": "auto"}
"""``law:`` keys added after runs were recorded, with their defaults: a key at its default is
left out of the record, so that a run recorded before it existed resumes (``widen``'s default
became ``auto`` in #38: such a run resumes with the calibrated factor, said in its reports)."""


def read_law_state(results_dir: str | Path | Location) -> dict[str, Any] | None:
    """The searcher's state file in a results folder, local or on object storage (None when
    absent)."""
    path = Location.of(results_dir).signed() / STATE_FILE
    return json.loads(path.read_text()) if path.exists() else None


class LawSearch(Algorithm):
    """Trials picked one batch at a time from the fitted scaling law (``sweeps.law``)."""

    name = "law"
    settings_key = "law"
    settings_type = LawSearchConfig
    keeps_state = True  # law_search.json, next to the results
    trains_up_front = False  # each trial trains (or loads) its own parent and stable run
    plan_title = "candidates"

    def parse_settings(self, raw: Any) -> Any:
        return parse_law_block(raw)

    def settings_missing(self) -> None:
        raise SearchSpaceError("algorithm=law needs a law: block, e.g. law: {law: eq8, target: "
                               "alpha3, ci_width: 0.1}")

    def validate(self, spec: Any) -> None:
        law = spec.settings
        if spec.sampled_params():
            raise SearchSpaceError(
                f"search.{spec.sampled_params()[0].key}: algorithm=law picks its trials from "
                "candidates (the grid, or law.box); make the knob a grid")
        if spec.scheduler != "fifo":
            raise SearchSpaceError("algorithm=law needs every trial's final loss: use "
                                   "scheduler: fifo")
        if spec.num_samples != 1:
            raise SearchSpaceError("algorithm=law decides how many trials to run: leave "
                                   "num_samples at 1 (bound it with law.max_trials)")
        if law.candidates == "grid" and not spec.grid_params():
            raise SearchSpaceError("law.candidates=grid needs grid knobs under search:")
        for var, key in law.variable_keys().items():
            problem = unknown_key(TrainConfig, key)
            if problem is not None:
                raise SearchSpaceError(f"law.variables.{var}={key}: {problem}")
        for k, _, _ in (law.box if law.candidates == "box" else ()):
            problem = unknown_key(TrainConfig, k)
            if problem is not None:
                raise SearchSpaceError(f"law.box.{k}: {problem}")

    def describe_plan(self, spec: Any, plan: Any) -> list[str]:
        cap = spec.settings.max_trials or plan.num_trials
        lines = [f"algorithm=law: the searcher picks at most {min(cap, plan.num_trials)} of "
                 f"these {plan.num_trials} candidates at run time (target {spec.settings.target}); "
                 "the totals below are for all of them"]
        if plan.branch_groups:
            lines.append("WSD stable runs are not trained up front: a trial trains its group's "
                         "on demand, extended from the furthest checkpoint earlier trials left "
                         "to its own decay start (so only as far as the longest budget picked "
                         "so far)")
        return lines

    def record(self, spec: Any) -> Any:
        rec = dataclasses.asdict(spec.settings)
        return {k: v for k, v in rec.items() if not (k in ADDED and v == ADDED[k])}

    def trial_cap(self, spec: Any, plan: Any) -> tuple[int, bool]:
        # runs at most max_trials of its candidates (and may stop sooner)
        return min(plan.num_trials, spec.settings.max_trials or plan.num_trials), True

    def param_space(self, spec: Any) -> dict[str, Any]:
        return {}  # the searcher suggests whole search points

    def searcher(self, spec: Any, plan: Any, results_dir: Any) -> Any:
        """The searcher keeps its state in ``results_dir``: restored with the experiment, it
        reads its own state file too, so a resume never starts the design over (ray#30861)."""
        return load("sweeps.law.searcher:LawSearcher")(
            spec.settings, candidates_from_plan(spec, plan), metric=spec.metric, mode=spec.mode,
            state_dir=results_dir)

    def num_samples(self, spec: Any, searcher: Any) -> int:
        return searcher.design.max_trials

    def trial_options(self, spec: Any, plan: Any, results_dir: Any) -> dict[str, Any]:
        """A trial trains its branch group's WSD stable run on to its own decay start where no
        earlier trial did (nothing is trained for budgets the search may never pick)."""
        return {"stable_dir": str(results_dir / "stable"), "stable_starts": on_demand_starts(
            spec, (plan.trial(spec, c.point) for c in candidates_from_plan(spec, plan)))}

    def state(self, results_dir: Any) -> dict[str, Any] | None:
        return read_law_state(results_dir)

    def planned(self, spec: Any, plan: Any, results_dir: Any) -> dict[str, Any]:
        """The estimates of the trials the searcher chose (from its state file, whichever
        searcher instance Tune ran): a finished search leaves no trial "not started", and its
        branch groups' stable runs were trained only to their longest chosen member's decay
        start."""
        est = plan.estimates()
        state = self.state(results_dir)
        if state is None:
            return est
        cands = candidates_from_plan(spec, plan)
        d = state["design"]
        chosen = [int(i) for i in d["observed"]] + list(d["failed"]) + list(d["pending"])
        trials = [plan.trial(spec, cands[i].point) for i in chosen]
        parents: dict[str, int] = {}
        groups: dict[str, list[int]] = {}
        for t in trials:
            if t.parent_key is not None:
                parents[t.parent_key] = t.config.parent_run().steps * \
                    t.config.parent_run().tokens_per_step
            if extends_stable(spec, t):
                groups.setdefault(t.stable_key, []).append(
                    t.decay_start * t.config.tokens_per_step)
        per_trial = sum(parents.get(t.parent_key, 0) for t in trials if t.parent_key is not None)
        finished = not d["queue"] and not d["pending"]
        return {**est, "trials": len(trials) if finished else est["trials"],
                "grid_points": len(cands), "parents": len(parents),
                "trial_tokens": sum(t.tokens for t in trials),
                "trial_flops": sum(6 * t.N_active * t.tokens for t in trials),
                "parent_tokens": sum(parents.values()),
                "tokens_saved_by_sharing": per_trial - sum(parents.values()),
                "branch_groups": sum(len(g) > 1 for g in groups.values()),
                "tokens_saved_by_branches": sum(sum(g) - max(g) for g in groups.values())}

    def after_run(self, spec: Any, plan: Any, results_dir: Any) -> dict[str, Any]:
        """The search's final refit on every trial, where the searcher instance Tune ran could
        not make it (a ``--resume`` of a finished search, or one that stopped at its trial
        cap), then its outcome (the summary's ``law`` entry)."""
        settled = self.searcher(spec, plan, results_dir)
        if settled.design.observed:
            settled.design.settle()
            settled.flush()
        state = self.state(results_dir)
        if state is None:
            return {}
        return {"law": outcome(spec.settings, state, len(candidates_from_plan(spec, plan)))}

    def closing_line(self, spec: Any, summary: Mapping[str, Any]) -> str | None:
        return describe_outcome(spec.settings, summary["law"]) if "law" in summary else None

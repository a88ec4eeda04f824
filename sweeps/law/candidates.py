"""The law search's candidates from a sweep's plan: each grid point (or a log grid over
``law.candidates.box``) with the law's variables and its FLOPs given shared parents and WSD
stable runs."""

from __future__ import annotations

import itertools

import numpy as np

from moe_core.params import count_params
from sweeps.law.design import Candidate
from sweeps.plan.build import extends_stable
from sweeps.spec.space import get_dotted
from sweeps.spec.trials import iter_grid


def candidates_from_plan(spec, plan) -> list[Candidate]:
    """The spec's candidates (its grid points, or a log-spaced grid over ``law.candidates.box``
    × seeds) with the law's variables and costs from the sweep plan: parents are shared, and a
    trial that branches (``sweeps.plan.build.extends_stable``) shares its group's WSD stable run,
    which is trained on demand only to the longest chosen member's decay start (its
    ``stable_flops``: 6·N2·tokens up to its own decay start)."""
    cfg = spec.settings
    if cfg.candidates == "grid":
        points = list(iter_grid(spec))
    else:
        keys = [k for k, _, _ in cfg.box]
        axes = [[_rounded(v) for v in np.geomspace(lo, hi, cfg.points)] for _, lo, hi in cfg.box]
        seeds = [{"seed": s} for s in spec.seeds] or [{}]
        points = [{**dict(zip(keys, combo)), **seed}
                  for combo in itertools.product(*axes) for seed in seeds]
    out = []
    for pt in points:
        t = plan.trial(spec, pt)
        x = {v: _variable(t, key) for v, key in cfg.variable_keys().items()}
        parent_flops = 0.0
        if t.parent_key is not None:
            pc = t.config.parent_run()
            parent_flops = 6.0 * count_params(pc.model_config()).non_embedding_active * \
                pc.steps * pc.tokens_per_step
        branch = extends_stable(spec, t)
        out.append(Candidate(x=x, point=dict(pt), trial_flops=6.0 * t.N_active * t.tokens,
                             parent=t.parent_key, parent_flops=parent_flops,
                             branch=t.stable_key if branch else None,
                             stable_flops=6.0 * t.N_active * t.decay_start *
                             t.config.tokens_per_step if branch else 0.0))
    return out


def _rounded(v: float) -> float | int:
    return int(round(v)) if v >= 1 else float(v)


def _variable(t, key: str) -> float:
    """A law variable's value in a trial: tokens as trained (steps × tokens per step), the
    parent's likewise, any other config key as set."""
    if key == "tokens":
        return float(t.tokens)
    if key == "parent.tokens":
        pc = t.config.parent_run()
        return float(pc.steps * pc.tokens_per_step)
    return float(get_dotted(t.config.to_dict(), key))

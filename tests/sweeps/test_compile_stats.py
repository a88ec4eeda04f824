"""Compile state per trial: a reused Tune actor runs several trials in one process, each starts
with an empty dynamo cache, and every row carries what compilation did
(``sweeps.run.compile_stats``).
"""

from __future__ import annotations

import pytest
import torch
import torch._dynamo

from sweeps.plan.build import build_plan
from sweeps.run import compile_stats
from sweeps.run.trial import TrialContext, run_trial
from sweeps.spec.sweep import parse_spec
from tests.sweeps.tiny import tiny_base


@pytest.fixture
def recompile_limit():
    """Lower dynamo's recompile limit for one test (``config.patch``: restored after)."""
    patches = []

    def lower(n: int) -> None:
        p = torch._dynamo.config.patch(recompile_limit=n)
        p.__enter__()
        patches.append(p)

    yield lower
    for p in reversed(patches):
        p.__exit__(None, None, None)


def test_counters_count_graphs_breaks_recompiles_and_the_limit(recompile_limit):
    recompile_limit(2)

    def f(x):
        y = x * 2
        torch._dynamo.graph_break()
        return y + 1

    g = torch.compile(f, backend="eager")
    compile_stats.start_trial()
    g(torch.ones(3))
    assert compile_stats.snapshot() == {"compile.graphs": 2, "compile.graph_breaks": 1,
                                        "compile.recompiles": 0, "compile.limit_hit": False}
    g(torch.ones(3, dtype=torch.float64))  # a new dtype: both frames compile again
    s = compile_stats.snapshot()
    assert s["compile.recompiles"] == 2 and not s["compile.limit_hit"]
    g(torch.ones(3, dtype=torch.bfloat16))  # a third variant: over the limit of 2, eager
    s = compile_stats.snapshot()
    assert s["compile.limit_hit"] and s["compile.graphs"] == 4
    compile_stats.start_trial()
    assert compile_stats.snapshot() == {"compile.graphs": 0, "compile.graph_breaks": 0,
                                        "compile.recompiles": 0, "compile.limit_hit": False}


@pytest.mark.slow
def test_trials_in_one_process_each_compile_from_scratch(tmp_path, monkeypatch,
                                                         recompile_limit):
    """Three differently shaped compiled trials through ``run_trial`` in this one process, as
    in a reused Tune actor. With dynamo's recompile limit lowered to 4 the third would run
    eager if the trials shared dynamo's cache (as they did before the per-trial reset); with
    the reset each trial's rows show the same, complete compilation. Blocks compile with
    dynamo's ``eager`` backend here (the counters are dynamo's, before any backend)."""
    from moe_core.model import Transformer

    recompile_limit(4)
    real = Transformer.enable_speedups
    monkeypatch.setattr(Transformer, "enable_speedups",
                        lambda self, **kw: real(self, **{**kw, "backend": "eager"}))
    base = tiny_base(model={"preset": "debug", "compile": True},
                     moe={"num_experts": 4, "top_k": 2})
    spec = parse_spec({"sweep": "c", "base": base, "resources": {"gpus": 0},
                       "search": {"moe.num_experts": {"grid": [2, 4, 8]}}})
    plan = build_plan(spec)
    finals = []
    for t in plan.trials:
        rows: list[dict] = []
        run_trial(dict(t.point), TrialContext(
            spec, plan, {}, str(tmp_path),
            report=lambda row, checkpoint=None, rows=rows: rows.append(row)))
        assert all("compile.graphs" in r for r in rows if r["status"] == "running")
        finals.append({k: v for k, v in rows[-1].items() if k.startswith("compile.")})
    assert len(finals) == 3
    assert finals[0]["compile.graphs"] > 0 and finals[0]["compile.graph_breaks"] >= 0
    assert not any(f["compile.limit_hit"] for f in finals)
    assert finals[1] == finals[0] and finals[2] == finals[0]

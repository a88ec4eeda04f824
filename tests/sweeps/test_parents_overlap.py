"""The driver's parents on a local Ray (``sweeps.run.parents.start_parents``): the trials may
start once every parent task has started, and a trial whose parent is ready gets it while
another parent still trains."""

from __future__ import annotations

import pytest
import yaml

from tests.sweeps.tiny import tiny_base


@pytest.mark.slow
@pytest.mark.distributed
def test_a_ready_parent_is_handed_out_while_another_still_trains(tmp_path, monkeypatch):
    import ray

    from sweeps.plan.build import build_plan
    from sweeps.run import parents
    from sweeps.spec.sweep import load_spec

    base = tiny_base(parent={"tokens": 512, "seed": 0}, moe={"num_experts": 4, "top_k": 2},
                     upcycle={"method": "dense_to_moe"})
    f = tmp_path / "spec.yaml"  # a 2-step parent and a 250-step one
    f.write_text(yaml.safe_dump({"sweep": "ov", "results": str(tmp_path / "r"), "base": base,
                                 "search": {"parent.tokens": {"grid": [512, 64000]}},
                                 "resources": {"cpus": 1, "gpus": 0},
                                 "logging": {"wandb": {"enabled": False}}}))
    spec = load_spec(str(f))
    plan = build_plan(spec)
    small, big = sorted(plan.parents, key=lambda k: plan.parents[k].tokens)
    ray.init(address="local", num_cpus=2, include_dashboard=False, configure_logging=False,
             log_to_driver=False)
    try:
        refs, overlapped = parents.start_parents(spec, plan, str(tmp_path / "cache"))
        assert overlapped and set(refs) == {small, big}
        t = next(t for t in plan.trials if t.parent_key == small)
        state = parents.get_parent(t.config, small, refs, str(tmp_path / "cache"))
        assert state is not None and state.tokens == plan.parents[small].tokens
        assert not ray.wait([refs[big]], timeout=0)[0]  # the big parent still trains
        assert ray.get(refs[big])["tokens"] == plan.parents[big].tokens
    finally:
        ray.shutdown()

"""A parent trained data-parallel on 2 gloo ranks (``resources.parent_ranks``, a Ray Train
TorchTrainer on the local CPU Ray) equals the one-rank parent within float reduction order, is
handed to a trial through the object store, and its ranks count as started on the start board
(the trials may start while it trains)."""

from __future__ import annotations

import numpy as np
import pytest
import yaml

from tests.sweeps.tiny import tiny_base

TOL = 1e-4
"""Largest |w_2 - w_1| accepted between the 2-rank and the 1-rank parents' weights after 8
AdamW steps of the same global batches (the same rows: ``TokenBatcher``); the ranks' gradients
may be summed in another order by the all-reduce. Measured on CPU: 0.0 (bit for bit)."""


def _trial(t, key, refs, cache, one_dir):
    """In one Ray worker: the one-rank parent (``train_parent``, as the one-rank task trains
    it) while the two ranks train theirs; then a trial's set-up (``sweeps.run.trial._start``:
    its parent from the object store, waiting for it) and the child trained from it."""
    from moe_core.schedules import Phase
    from moe_core.train.loop import Trainer
    from moe_core.train.runner import train_parent
    from sweeps.run.parents import get_parent

    one, _ = train_parent(t.config, one_dir)
    parent = get_parent(t.config, key, refs, cache)
    res = Trainer(t.config, parent=parent, phase=Phase.full()).fit()
    diff = max(float(np.abs(parent.model_state[k] - one.model_state[k]).max())
               for k in one.model_state)
    return diff, one.val_loss, parent.val_loss, res.val_loss, res.steps


@pytest.mark.slow
@pytest.mark.distributed
def test_a_parent_on_two_ranks_equals_the_one_rank_parent_and_a_trial_trains_from_it(tmp_path):
    import ray

    from sweeps.plan.build import build_plan
    from sweeps.run import parents
    from sweeps.spec.sweep import load_spec

    base = tiny_base(parent={"tokens": 2048, "seed": 0}, moe={"num_experts": 4, "top_k": 2},
                     upcycle={"method": "dense_to_moe"}, tokens=512,
                     batch={"global_batch": 8, "micro_batch": 4})
    f = tmp_path / "spec.yaml"
    f.write_text(yaml.safe_dump({"sweep": "pr", "results": str(tmp_path / "r"), "base": base,
                                 "resources": {"cpus": 1, "gpus": 0, "parent_ranks": 2},
                                 "logging": {"wandb": {"enabled": False}}}))
    spec = load_spec(str(f))
    plan = build_plan(spec)
    (key,) = plan.parents
    ray.init(address="local", num_cpus=3, include_dashboard=False, configure_logging=False,
             log_to_driver=False)
    try:
        refs, overlapped = parents.start_parents(spec, plan, str(tmp_path / "cache"))
        assert overlapped  # rank 0 marked the board once both ranks held their CPUs
        trial = ray.remote(num_cpus=1)(_trial).remote(
            plan.trials[0], key, refs, str(tmp_path / "cache"), str(tmp_path / "one"))
        two = ray.get(refs[key])
        assert two["_ranks"] == 2 and two["_trained_now"] and two["tokens"] == 2048
        diff, one_val, parent_val, child_val, steps = ray.get(trial)
        assert diff <= TOL and parent_val == two["val_loss"]
        assert two["val_loss"] == pytest.approx(one_val, abs=TOL)
        assert steps == 2 and np.isfinite(child_val)
    finally:
        ray.shutdown()

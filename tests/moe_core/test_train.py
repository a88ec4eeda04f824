"""The DeepSpeed training loop: determinism, WSD branch == single run, resume == uninterrupted,
divergence, refused configs, the debug preset learning on the built-in corpus."""

import dataclasses
import math

import pytest
import torch

from moe_core.errors import ConfigError, DivergenceError
from moe_core.train import train, train_config_from_dict
from moe_core.train.checkpoint import load_checkpoint
from moe_core.train.wsd import branch, decay_schedule, log_spaced_tokens, stable_schedule


def small_cfg(tmp_path, **over):
    d = {
        "name": "t", "seed": 0, "model": {"preset": "debug"},
        "data": {"source": "synthetic", "synthetic_vocab": 32, "synthetic_tokens": 60_000,
                 "seq_len": 32, "cache_dir": str(tmp_path / "cache")},
        "batch": {"global_batch": 8, "micro_batch": 4},
        "optim": {"lr": 3e-3},
        "schedule": {"kind": "wsd", "warmup_steps": 2, "decay_frac": 0.25},
        "eval": {"every_steps": 2, "batches": 2},
        "tokens": 8 * 32 * 8,
    }
    for k, v in over.items():
        d[k] = v
    return train_config_from_dict(d)


def _state(res_or_model):
    return {k: torch.as_tensor(v) for k, v in res_or_model.state.items()}


def test_same_seed_same_losses(tmp_path):
    cfg = small_cfg(tmp_path, moe={"num_experts": 4, "top_k": 2})
    a = train(cfg, keep_state=True)
    b = train(cfg, keep_state=True)
    assert [m["val_loss"] for m in a.curve] == [m["val_loss"] for m in b.curve]
    assert all(torch.equal(_state(a)[k], _state(b)[k]) for k in a.state)
    assert a.steps == 8 and a.tokens == 8 * 8 * 32
    assert a.val_loss < a.initial_val_loss


@pytest.mark.parametrize("moe", [None, {"num_experts": 4, "top_k": 2}])
def test_branch_equals_single_run(tmp_path, moe):
    cfg = small_cfg(tmp_path, moe=moe)
    s, n = 6, 4
    peak = cfg.optim.lr
    single = train(cfg, schedule_override=(peak, decay_schedule(cfg, s, n)), keep_state=True)
    stable = train(cfg, schedule_override=stable_schedule(cfg, s), out_dir=tmp_path / "st",
                   checkpoint_steps=[s])
    ck = stable.checkpoints[s]
    br = branch(cfg, ck, decay_tokens=n * cfg.tokens_per_step)
    br_state = train(cfg, resume_from=ck, schedule_override=(peak, decay_schedule(cfg, s, n)),
                     end_step=s + n, eval_at_start=False, keep_state=True)
    assert br.steps == single.steps == s + n
    assert br.val_loss == single.val_loss  # bit for bit
    assert all(torch.equal(_state(br_state)[k], _state(single)[k]) for k in single.state)
    # the stable run's LR never decayed, the branch's last LR is min_ratio · peak
    assert stable.final_lr == pytest.approx(peak)
    assert br.final_lr == pytest.approx(0.1 * peak)


def test_resume_equals_uninterrupted(tmp_path):
    cfg = small_cfg(tmp_path, moe={"num_experts": 4, "top_k": 1,
                                   "router": {"loss_free_rate": 0.01}})
    full = train(cfg, keep_state=True)
    part = train(cfg, out_dir=tmp_path / "ck", checkpoint_steps=[4], end_step=4)  # "killed"
    rest = train(cfg, resume_from=part.checkpoints[4], eval_at_start=False, keep_state=True)
    assert [m["val_loss"] for m in part.curve + rest.curve] == [m["val_loss"]
                                                                 for m in full.curve]
    assert all(torch.equal(_state(rest)[k], _state(full)[k]) for k in full.state)


def test_checkpoint_checksum_detects_corruption(tmp_path):
    cfg = small_cfg(tmp_path)
    res = train(cfg, out_dir=tmp_path / "ck", checkpoint_steps=[2], end_step=2)
    path = res.checkpoints[2]
    ck = load_checkpoint(path)
    assert ck.step == 2 and "model" in ck.meta["files"]
    f = next(p for p in (tmp_path / "ck" / "step_00000002").iterdir()
             if p.name.startswith("model"))
    data = bytearray(f.read_bytes())
    data[-1] ^= 0xFF
    f.write_bytes(bytes(data))
    from moe_core.errors import CheckpointError

    with pytest.raises(CheckpointError, match="checksum mismatch"):
        load_checkpoint(path)


def test_divergence_raises_with_step(tmp_path, monkeypatch):
    from moe_core.model import Transformer

    orig = Transformer.forward
    calls = {"n": 0}

    def bad(self, tokens, targets=None):
        out = orig(self, tokens, targets)
        if self.training:
            calls["n"] += 1
            if calls["n"] > 5 and out.loss is not None:
                out.loss = out.loss * float("nan")
        return out

    monkeypatch.setattr(Transformer, "forward", bad)
    with pytest.raises(DivergenceError, match=r"diverged at step 3") as e:
        train(small_cfg(tmp_path))
    assert e.value.step == 3


def test_zero3_with_moe_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"optim\.zero_stage=3 is not supported with MoE"):
        small_cfg(tmp_path, moe={"num_experts": 4, "top_k": 2},
                  optim={"lr": 1e-3, "zero_stage": 3})


def test_batch_not_divisible_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"batch\.micro_batch=4 does not divide"):
        small_cfg(tmp_path, batch={"global_batch": 6, "micro_batch": 4})
    cfg = small_cfg(tmp_path, batch={"global_batch": 6, "micro_batch": 3})
    with pytest.raises(ConfigError, match=r"global_batch=6 is not divisible by the 4 ranks"):
        cfg.batch.accumulation_steps(4)


@pytest.mark.parametrize("stage", [1, 2])
def test_zero_stages_train_and_resume(tmp_path, stage):
    cfg = small_cfg(tmp_path, moe={"num_experts": 4, "top_k": 2},
                    optim={"lr": 3e-3, "zero_stage": stage})
    part = train(cfg, out_dir=tmp_path / "ck", checkpoint_steps=[4], end_step=4)
    rest = train(cfg, resume_from=part.checkpoints[4], eval_at_start=False)
    full = train(cfg)
    assert rest.val_loss == pytest.approx(full.val_loss, abs=1e-6)


def test_log_spaced_tokens():
    assert log_spaced_tokens(1000, 4, 1) == [1, 10, 100, 1000]
    with pytest.raises(ConfigError):
        log_spaced_tokens(10, 3, 100)


@pytest.mark.slow
def test_debug_preset_learns_builtin_corpus(tmp_path):
    cfg = train_config_from_dict({
        "model": {"preset": "debug"},
        "data": {"source": "stdlib", "tokenizer": "bytes", "seq_len": 64,
                 "cache_dir": str(tmp_path / "cache")},
        "batch": {"global_batch": 16, "micro_batch": 16},
        "optim": {"lr": 5e-3},
        "schedule": {"kind": "wsd", "warmup_steps": 10},
        "eval": {"every_steps": 50, "batches": 4},
        "tokens": 150 * 16 * 64,
    })
    res = train(cfg)
    assert res.initial_val_loss == pytest.approx(math.log(256), abs=0.3)
    assert res.val_loss < res.initial_val_loss - 2.0  # bytes of Python source are predictable
    assert res.wall_s < 120


def test_tokens_to_steps_and_parent_run(tmp_path):
    cfg = small_cfg(tmp_path, moe={"num_experts": 4, "top_k": 2}, parent={"tokens": 1000},
                    upcycle={"method": "dense_to_moe"})
    p = cfg.parent_run()
    assert p.moe is None and p.tokens == 1000 and p.steps == math.ceil(1000 / (8 * 32))
    assert dataclasses.replace(cfg, tokens=1).steps == 1

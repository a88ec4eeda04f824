"""The DeepSpeed training loop: determinism, WSD branch == single run, resume == uninterrupted,
divergence, refused configs, the debug preset learning on the built-in corpus."""

import dataclasses
import math

import pytest
import torch

from moe_core.errors import ConfigError, DivergenceError
from moe_core.schedules import Phase
from moe_core.train import Trainer, train, train_config_from_dict
from moe_core.train.checkpoint import load_checkpoint
from moe_core.train.wsd import branch, log_spaced_tokens, train_stable


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


def fit(cfg, **kw):
    """(result, final model state) of one run."""
    t = Trainer(cfg, **kw)
    res = t.fit()
    return res, {k: torch.as_tensor(v) for k, v in t.model_state_numpy().items()}


def _equal(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_same_seed_same_losses(tmp_path):
    cfg = small_cfg(tmp_path, moe={"num_experts": 4, "top_k": 2})
    a, sa = fit(cfg)
    b, sb = fit(cfg)
    assert [m["val_loss"] for m in a.curve] == [m["val_loss"] for m in b.curve]
    assert _equal(sa, sb)
    assert a.steps == 8 and a.tokens == 8 * 8 * 32
    assert a.val_loss < a.initial_val_loss


@pytest.mark.parametrize("moe", [None, {"num_experts": 4, "top_k": 2}])
def test_branch_equals_single_run(tmp_path, moe):
    cfg = small_cfg(tmp_path, moe=moe)
    s, n = 6, 4
    peak = cfg.optim.lr
    # the single WSD run of s + n steps whose decay covers its last n: a run of s + n steps
    single, s_single = fit(dataclasses.replace(
        cfg, tokens=(s + n) * cfg.tokens_per_step,
        schedule=dataclasses.replace(cfg.schedule, decay_frac=n / (s + n))))
    stable = train_stable(cfg, tmp_path / "st", [s])
    ck = stable.checkpoints[s]
    br = branch(cfg, ck, decay_tokens=n * cfg.tokens_per_step)
    br2, s_br = fit(cfg, resume_from=ck, phase=Phase.decay(s, n))
    assert br.steps == br2.steps == single.steps == s + n
    assert br.val_loss == br2.val_loss == single.val_loss  # bit for bit
    assert _equal(s_br, s_single)
    assert [m["step"] for m in br.curve] == [8, 10]  # no eval at the resumed start
    # the stable run's LR never decayed, the branch's last LR is min_ratio · peak
    assert stable.final_lr == pytest.approx(peak)
    assert br.final_lr == pytest.approx(0.1 * peak)


def test_resume_equals_uninterrupted(tmp_path):
    cfg = small_cfg(tmp_path, moe={"num_experts": 4, "top_k": 1,
                                   "router": {"loss_free_rate": 0.01}})
    full, s_full = fit(cfg)
    part = Trainer(cfg, out_dir=tmp_path / "ck", checkpoint_steps=[4]).fit(until=4)  # "killed"
    rest, s_rest = fit(cfg, resume_from=part.checkpoints[4])
    assert [m["val_loss"] for m in part.curve + rest.curve] == [m["val_loss"]
                                                                 for m in full.curve]
    assert _equal(s_rest, s_full)


def test_checkpoint_checksum_detects_corruption(tmp_path):
    cfg = small_cfg(tmp_path)
    res = Trainer(cfg, out_dir=tmp_path / "ck", checkpoint_steps=[2]).fit(until=2)
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
    part = Trainer(cfg, out_dir=tmp_path / "ck", checkpoint_steps=[4]).fit(until=4)
    rest = train(cfg, resume_from=part.checkpoints[4])
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


def test_step_and_callbacks_at_named_points(tmp_path):
    """step() is one optimizer step; fit() hands each eval and its checkpoint to on_eval in
    one call, after the checkpoint was written."""
    from moe_core.train import Callback

    seen = []

    class Rec(Callback):
        def on_eval(self, metrics, checkpoint):
            assert checkpoint is None or (checkpoint / "meta.json").exists()
            seen.append((metrics["step"], checkpoint is not None))

        def on_checkpoint(self, step, path):
            seen.append(("ck", step))

    cfg = small_cfg(tmp_path)
    t = Trainer(cfg, out_dir=tmp_path / "ck", checkpoint_steps=[2, 4], callbacks=(Rec(),))
    out = t.step()
    assert out.step == 1 and t.step_count == 1 and math.isfinite(out.train_loss)
    assert out.lr == pytest.approx(cfg.optim.lr / 2)  # warmup: (0 + 1) / 2 of the peak
    res = t.fit()
    assert seen == [(2, True), ("ck", 2), (4, True), ("ck", 4), (6, False), (8, True),
                    ("ck", 8)]
    assert res.steps == 8 and sorted(res.checkpoints) == [2, 4, 8]


def test_branch_refuses_another_peak(tmp_path):
    cfg = small_cfg(tmp_path)
    stable = train_stable(cfg, tmp_path / "st", [4])
    other = dataclasses.replace(cfg, optim=dataclasses.replace(cfg.optim, lr=1e-3))
    with pytest.raises(ConfigError, match="peak LR"):
        branch(other, stable.checkpoints[4], decay_tokens=2 * cfg.tokens_per_step)


def _ck_equal(a, b):
    """Model, optimizer and RNG state of two checkpoints are equal bit for bit."""
    a, b = load_checkpoint(a), load_checkpoint(b)
    assert a.step == b.step
    assert _equal(a.model_state(), b.model_state())
    oa, ob = a.optimizer_state(), b.optimizer_state()
    flat = [(x, y) for x, y in zip(torch.utils._pytree.tree_leaves(oa),
                                   torch.utils._pytree.tree_leaves(ob))]
    assert len(flat) == len(torch.utils._pytree.tree_leaves(oa)) > 0
    for x, y in flat:
        assert (torch.equal(x, y) if isinstance(x, torch.Tensor) else x == y), (x, y)
    assert torch.equal(a.rng_state(), b.rng_state())


def test_extended_stable_run_equals_one_go(tmp_path):
    """A stable run trained to s1 and extended to s2 (resumed from its s1 checkpoint) is the
    stable run trained to s2 in one go, bit for bit (model, AdamW state, RNG), whatever the
    budget of the config that trains each part; a branch from it is the single WSD run."""
    moe = {"num_experts": 4, "top_k": 1, "router": {"loss_free_rate": 0.01}}
    cfg = small_cfg(tmp_path, moe=moe)
    s1, s2, n = 3, 7, 3  # s1 mid-warmup-free, not an eval step; s2 not one either
    one = train_stable(cfg, tmp_path / "one", [s1, s2])
    # the two parts trained by configs of other budgets (as two law-search trials would)
    small = dataclasses.replace(cfg, tokens=4 * cfg.tokens_per_step)
    big = dataclasses.replace(cfg, tokens=40 * cfg.tokens_per_step)
    a = train_stable(small, tmp_path / "ext", [s1])
    b = train_stable(big, tmp_path / "ext", [s2], resume_from=a.checkpoints[s1])
    assert sorted(b.checkpoints) == [s2] and b.steps == s2
    _ck_equal(one.checkpoints[s1], a.checkpoints[s1])
    _ck_equal(one.checkpoints[s2], b.checkpoints[s2])
    # the evals of the one-go run at its eval steps are the extended run's (which adds one at
    # the end of its first part)
    ext = {m["step"]: m["val_loss"] for m in a.curve + b.curve}
    assert all(ext[m["step"]] == m["val_loss"] for m in one.curve)
    single, s_single = fit(dataclasses.replace(
        cfg, tokens=(s2 + n) * cfg.tokens_per_step,
        schedule=dataclasses.replace(cfg.schedule, decay_frac=n / (s2 + n))))
    br, s_br = fit(cfg, resume_from=b.checkpoints[s2], phase=Phase.decay(s2, n))
    assert br.val_loss == single.val_loss and _equal(s_br, s_single)

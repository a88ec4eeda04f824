"""LR schedules against hand values, branch equality, LR-reset policies, validation."""

import math

import pytest

from moe_core.errors import ConfigError
from moe_core.schedules import (
    LRPolicyConfig,
    ScheduleConfig,
    lr_at,
    resolve_lr_policy,
)


def test_wsd_hand_values():
    cfg = ScheduleConfig(kind="wsd", warmup_steps=4, total_steps=20, decay_frac=0.2,
                         min_ratio=0.1)
    lrs = [lr_at(s, peak=1.0, cfg=cfg) for s in range(20)]
    assert lrs[:4] == pytest.approx([0.25, 0.5, 0.75, 1.0])  # (step+1)/warmup
    assert lrs[4:16] == pytest.approx([1.0] * 12)  # stable
    # decay: 4 steps (16..19) from 1 to 0.1: 1 - 0.9·(k/4), k = 1..4
    assert lrs[16:] == pytest.approx([0.775, 0.55, 0.325, 0.1])
    assert cfg.decay_start == 16


def test_cosine_and_constant_hand_values():
    cfg = ScheduleConfig(kind="cosine", warmup_steps=2, total_steps=12, min_ratio=0.1)
    assert lr_at(0, peak=2.0, cfg=cfg) == pytest.approx(1.0)
    assert lr_at(2, peak=2.0, cfg=cfg) == pytest.approx(2.0)
    # midpoint of the cosine (t = 0.5): lo + (peak - lo)/2 = 0.2 + 0.9
    mid = 2 + (12 - 1 - 2) / 2
    assert lr_at(int(mid), peak=2.0, cfg=cfg) == pytest.approx(
        0.2 + 1.8 * 0.5 * (1 + math.cos(math.pi * (int(mid) - 2) / 9)))
    assert lr_at(11, peak=2.0, cfg=cfg) == pytest.approx(0.2)
    const = ScheduleConfig(kind="constant", warmup_steps=0, total_steps=5)
    assert [lr_at(s, peak=3.0, cfg=const) for s in range(5)] == [3.0] * 5


def test_run_schedule_phases_decide_every_lr():
    """One resolver: full run, stable phase (no decay), decay branch == single WSD run."""
    from types import SimpleNamespace

    from moe_core.schedules import Phase, run_schedule

    base = ScheduleConfig(kind="wsd", warmup_steps=3, decay_frac=0.25)
    cfg = SimpleNamespace(schedule=base, steps=48, optim=SimpleNamespace(lr=1.0), upcycle=None)
    full = run_schedule(cfg)
    assert full.peak == 1.0 and full.end_step == 48 and full.schedule.decay_start == 36
    stable = run_schedule(cfg, phase=Phase.stable(40))
    assert stable.end_step == 40
    assert [stable.lr(s) for s in range(40)] == [min(1.0, (s + 1) / 3) for s in range(40)]
    s, n = 37, 11
    br = run_schedule(cfg, phase=Phase.decay(s, n))
    single = ScheduleConfig(kind="wsd", warmup_steps=3, total_steps=s + n, decay_frac=n / (s + n))
    assert br.end_step == s + n
    for step in range(s + n):
        assert br.lr(step) == lr_at(step, peak=1.0, cfg=single)
        if step < s:
            assert br.lr(step) == stable.lr(step)
    assert br.lr(s + n - 1) == pytest.approx(0.1)
    # with a parent, the LR policy decides the peak in every phase
    parent = SimpleNamespace(peak_lr=4.0, final_lr=0.4)
    up = SimpleNamespace(lr_policy=LRPolicyConfig(policy="ratio", ratio=0.5))
    cfg_up = SimpleNamespace(**{**vars(cfg), "upcycle": up})
    for ph in (Phase.full(), Phase.stable(10), Phase.decay(10, 5)):
        assert run_schedule(cfg_up, parent, ph).peak == 2.0
    const = SimpleNamespace(**{**vars(cfg), "upcycle": SimpleNamespace(
        lr_policy=LRPolicyConfig(policy="constant"))})
    c = run_schedule(const, parent)
    assert c.peak == 0.4 and c.lr(0) == 0.4 and c.lr(47) == 0.4
    with pytest.raises(ConfigError, match="decay phase"):
        run_schedule(const, parent, Phase.decay(10, 5))
    with pytest.raises(ConfigError, match="steps >= 1"):
        Phase.stable(0)


def test_lr_policies():
    sched = ScheduleConfig(kind="wsd", warmup_steps=5, total_steps=50)
    peak, cfg = resolve_lr_policy(LRPolicyConfig(policy="constant"), parent_peak=4e-3,
                                  parent_final_lr=4e-4, schedule_cfg=sched)
    assert peak == 4e-4 and cfg.kind == "constant" and cfg.warmup_steps == 0
    assert lr_at(0, peak=peak, cfg=cfg) == 4e-4 and lr_at(49, peak=peak, cfg=cfg) == 4e-4
    peak, cfg = resolve_lr_policy(LRPolicyConfig(policy="reset", peak=2e-3), parent_peak=4e-3,
                                  parent_final_lr=4e-4, schedule_cfg=sched)
    assert peak == 2e-3 and cfg == sched
    peak, _ = resolve_lr_policy(LRPolicyConfig(policy="ratio", ratio=0.5), parent_peak=4e-3,
                                parent_final_lr=4e-4, schedule_cfg=sched)
    assert peak == pytest.approx(2e-3)
    peak, _ = resolve_lr_policy(LRPolicyConfig(policy="reset"), parent_peak=4e-3,
                                parent_final_lr=4e-4, schedule_cfg=sched, default_peak=1e-3)
    assert peak == 1e-3


@pytest.mark.parametrize("kwargs, match", [
    (dict(kind="linear"), r"schedule\.kind='linear' is not known"),
    (dict(warmup_steps=-1), r"schedule\.warmup_steps=-1"),
    (dict(total_steps=0), r"schedule\.total_steps=0"),
    (dict(decay_frac=1.5), r"schedule\.decay_frac=1\.5 must lie in \[0, 1\]"),
    (dict(min_ratio=-0.1), r"schedule\.min_ratio=-0\.1"),
])
def test_schedule_rules(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        ScheduleConfig(**kwargs)


@pytest.mark.parametrize("kwargs, match", [
    (dict(policy="warm"), r"upcycle\.lr_policy\.policy='warm' is not known"),
    (dict(peak=0.0), r"upcycle\.lr_policy\.peak=0\.0 must be > 0"),
    (dict(ratio=0.0), r"upcycle\.lr_policy\.ratio=0\.0 must be > 0"),
])
def test_policy_rules(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        LRPolicyConfig(**kwargs)


def test_total_steps_required():
    with pytest.raises(ConfigError, match="total_steps is not set"):
        lr_at(0, peak=1.0, cfg=ScheduleConfig())

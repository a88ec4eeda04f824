"""The Trainer's checkpoint policy hook and the lineage wall clock (``wall_s`` of a resumed run or
a WSD branch continues from its checkpoint's)."""

from moe_core.schedules import Phase
from moe_core.train import Callback, Trainer
from moe_core.train.checkpoint import load_checkpoint
from moe_core.train.wsd import train_stable

from .test_train import small_cfg


class Rec(Callback):
    def __init__(self):
        self.seen = []

    def on_eval(self, metrics, checkpoint):
        assert checkpoint is None or (checkpoint / "meta.json").exists()
        self.seen.append((metrics["step"], checkpoint is not None))


def test_policy_asked_at_each_eval_decides_the_checkpoints(tmp_path):
    asked = []

    def every_other_eval(step, last):
        asked.append((step, last))
        return step % 4 == 0 or last

    rec = Rec()
    res = Trainer(small_cfg(tmp_path), out_dir=tmp_path / "ck", callbacks=(rec,),
                  should_checkpoint=every_other_eval).fit()
    assert asked == [(2, False), (4, False), (6, False), (8, True)]  # at evals only
    assert rec.seen == [(0, False), (2, False), (4, True), (6, False), (8, True)]
    assert sorted(res.checkpoints) == [4, 8]
    assert sorted(p.name for p in (tmp_path / "ck").iterdir()) == ["step_00000004",
                                                                    "step_00000008"]


def test_no_policy_no_steps_no_checkpoint(tmp_path):
    rec = Rec()
    res = Trainer(small_cfg(tmp_path), out_dir=tmp_path / "ck", callbacks=(rec,)).fit()
    assert res.checkpoints == {} and not any(c for _, c in rec.seen)


def _walls(curve):
    return [m["wall_s"] for m in curve]


def test_wall_clock_continues_through_resume_and_branch(tmp_path):
    cfg = small_cfg(tmp_path)
    part = Trainer(cfg, out_dir=tmp_path / "ck", checkpoint_steps=[4]).fit(until=4)
    ck = load_checkpoint(part.checkpoints[4])
    assert ck.meta["wall_s"] >= part.curve[-1]["wall_s"] > 0
    rest = Trainer(cfg, resume_from=part.checkpoints[4]).fit()
    walls = _walls(part.curve + rest.curve)
    assert walls == sorted(walls) and rest.curve[0]["wall_s"] > ck.meta["wall_s"]
    assert rest.wall_s >= rest.curve[-1]["wall_s"]
    # a WSD branch: the stable run's evals up to the branch step, then the branch's own
    stable = train_stable(cfg, tmp_path / "st", [6])
    br = Trainer(cfg, resume_from=stable.checkpoints[6], phase=Phase.decay(6, 2)).fit()
    walls = _walls([m for m in stable.curve if m["step"] <= 6] + br.curve)
    assert walls == sorted(walls) and br.curve[0]["wall_s"] > stable.curve[-1]["wall_s"]

"""A trial's set-up says what it is doing, how far it has got and an ETA before its first eval
(issue #39 item 3): the Trainer announces its stages with sizes, a trial's board records them,
and the driver's line names the stage, its seconds and an ETA scaled from earlier set-ups;
a parent's stage and steps get an ETA too."""

from __future__ import annotations

import json

from moe_core.train.callbacks import Callback
from sweeps.run import console
from sweeps.run.parents import ProgressFile, progress_part
from sweeps.run.setup_progress import SetupBoard, lines_for, read_boards, setup_line
from sweeps.spec.sweep import parse_spec
from tests.sweeps.tiny import tiny_base


class Clock:
    def __init__(self, t: float = 1000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


def test_board_records_stages_and_the_line_gives_an_eta_scaled_by_size(tmp_path):
    clock = Clock()
    first = SetupBoard(tmp_path / "a.json", param_bytes=1000, stages=3, clock=clock)
    first.on_stage("data: synthetic tokens")
    clock.t += 10
    first.on_stage("model: fresh, 0.1 M params, 0 MB fp32")
    clock.t += 30
    first.on_eval({"step": 0}, None)  # set-up done after 40 s
    first.on_stage("late")  # after the first eval: not set-up any more
    assert read_boards(tmp_path)["a"]["stages"] == [["data: synthetic tokens", 1000.0],
                                                    ["model: fresh, 0.1 M params, 0 MB fp32",
                                                     1010.0]]
    second = SetupBoard(tmp_path / "b.json", param_bytes=2000, stages=3, clock=clock)
    second.on_stage("data: synthetic tokens")
    clock.t += 5
    second.on_stage("engine: DeepSpeed ZeRO-0, float32, 0.2 M params")
    clock.t += 15
    # twice the bytes of the one earlier set-up of 40 s: 80 s, 20 s spent, 60 s left
    assert lines_for(tmp_path, ["b"], now=clock.t) == {"b": (
        "trial b: set-up 2/3 engine: DeepSpeed ZeRO-0, float32, 0.2 M params (15 s in this "
        "stage, 20 s in set-up; ETA ~60 s (from 1 earlier set-up, scaled by size))")}
    # the first trial has nothing to go by; a trial with no stage yet just sets up
    alone = json.loads((tmp_path / "b.json").read_text())
    assert setup_line("b", alone, [], clock.t).endswith(
        "ETA unknown until a first trial has set up)")
    assert setup_line("c", None, [], clock.t) == \
        "trial c: setting up (no stage reported yet)"


def test_the_ticker_shows_the_set_up_line_of_a_trial_without_an_eval():
    t = console.Ticker(every_s=30, clock=lambda: 100.0)
    rows = {0: {"step": 0, "tokens": 0, "wall_s": 1.0, "train_loss": None, "val_loss": 4.0}}
    asked = []

    def setup(ids):
        asked.append(ids)
        return {i: f"trial {i}: set-up 1/6 data" for i in ids}

    assert t.lines([("a", rows, 8), ("b", {}, 8)], setup=setup) == [
        "trial a: step 0/8  train_loss -  val_loss 4.0000  - tok/s  (last eval)",
        "trial b: set-up 1/6 data"]
    assert asked == [["b"]]  # only the trials with no eval are looked up


def test_parent_stages_and_steps_carry_an_eta(tmp_path):
    pf = ProgressFile(tmp_path / "p.json", 0)
    pf.on_stage("loading 500 MB of safetensors from x")
    p = json.loads(pf.path.read_text())
    assert progress_part("hf-0123456789", p, p["since"] + 7) == \
        "hf-01234 loading 500 MB of safetensors from x (7 s)"  # nothing to scale from yet
    # writing 1000 MB after 500 MB took 20 s: 40 s, 10 s of it spent
    p = {"stage": "writing the parent cache (1,000 MB fp32)", "since": 50.0,
         "prev": ["loading 500 MB of safetensors from x", 20.0]}
    assert progress_part("hf-0123456789", p, 60.0) == \
        "hf-01234 writing the parent cache (1,000 MB fp32) (10 s, ETA ~30 s)"
    step = {"step": 4, "steps": 10, "val_loss": 2.5, "started": 0.0}
    assert progress_part("abcdefghij", step, 8.0) == \
        "abcdefgh step 4/10 val 2.5000 (ETA ~12 s)"  # 2 s a step, 6 steps left


class Stages(Callback):
    def __init__(self):
        self.seen = []

    def on_stage(self, text):
        self.seen.append(text)


def test_the_trainer_announces_its_set_up_stages_with_sizes():
    from moe_core.params import count_params
    from moe_core.train.loop import Trainer

    cfg = parse_spec({"sweep": "s", "base": tiny_base()}).base_config
    stages = Stages()
    t = Trainer(cfg, callbacks=(stages,))
    n = count_params(cfg.model_config(t.vocab_size)).total
    assert stages.seen == [
        "data: synthetic tokens, 2 val batches of 8 x 32",
        f"model: fresh, {n / 1e6:,.1f} M params, {n * 4 / 1e6:,.0f} MB fp32",
        f"engine: DeepSpeed ZeRO-0, float32, {n / 1e6:,.1f} M params"]


def test_a_parent_task_says_it_hashes_and_how_much(tmp_path):
    """The parent task's first stage, written under the driver's key before it hashes: a
    pretrained parent names the bytes it reads (no bare repeated "starting")."""
    from types import SimpleNamespace

    from sweeps.run.parents import hashing_stage

    (tmp_path / "model.safetensors").write_bytes(b"x" * 2_500_000)
    child = SimpleNamespace(parent=SimpleNamespace(from_pretrained=str(tmp_path)))
    assert hashing_stage(child) == "hashing its inputs (2 MB of safetensors)"
    trained = SimpleNamespace(parent=SimpleNamespace(from_pretrained=None))
    assert hashing_stage(trained) == "hashing its inputs (its config)"

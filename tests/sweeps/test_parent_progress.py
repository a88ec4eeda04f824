"""Preparing a pretrained parent says what it is doing and how large (issue #39 item 3): the
stages reach the progress file the driver polls, and the driver's line names the stage and for
how long, never a bare repeated "starting"."""

from __future__ import annotations

import json

from moe_core.train.callbacks import Callback
from moe_core.train.runner import load_pretrained_parent
from sweeps.parents import ProgressFile, progress_part
from tests.hf_util import tiny_dense


class Stages(Callback):
    def __init__(self):
        self.seen = []

    def on_stage(self, text):
        self.seen.append(text)


def test_a_pretrained_parent_announces_its_stages_with_sizes(tmp_path):
    src = tiny_dense("llama", tmp_path / "llama")
    stages = Stages()
    progress = ProgressFile(tmp_path / "k.progress.json", 0)
    load_pretrained_parent(src, tmp_path / "cache" / "hf-abc", (stages, progress))
    mb = sum(f.stat().st_size for f in src.glob("*.safetensors")) / 1e6
    assert stages.seen == [f"loading {mb:,.0f} MB of safetensors from llama",
                           f"writing the parent cache ({mb:,.0f} MB fp32)"]
    p = json.loads(progress.path.read_text())
    assert p["stage"] == stages.seen[-1]
    assert progress_part("hf-0123456789", p, p["since"] + 42) == \
        f"hf-01234 {stages.seen[-1]} (42 s)"
    step = {"step": 3, "steps": 10, "val_loss": 2.5}
    assert progress_part("abcdefghij", step, 0.0) == "abcdefgh step 3/10 val 2.5000"

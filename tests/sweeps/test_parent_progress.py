"""Preparing a pretrained parent says what it is doing and how large (issue #39 item 3): the
stages reach the progress file the driver polls, and the driver's line names the stage and for
how long, never a bare repeated "starting"."""

from __future__ import annotations

import json

from moe_core.train.callbacks import Callback
from moe_core.train.runner import load_pretrained_parent
from sweeps.run.parents import ProgressFile, progress_part, stage_eta
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
    loading = p["prev"][1]  # seconds the loading took; writing scales it by size (ETA)
    assert p["prev"][0] == stages.seen[0] and loading >= 0
    assert progress_part("hf-0123456789", p, p["since"] + 42) == \
        f"hf-01234 {stages.seen[-1]} (42 s{stage_eta(p, p['since'] + 42)})"
    step = {"step": 3, "steps": 10, "val_loss": 2.5}
    assert progress_part("abcdefghij", step, 0.0) == "abcdefgh step 3/10 val 2.5000"


def test_the_parent_cache_estimate_counts_tied_embeddings_twice(tmp_path):
    """A tied checkpoint's parent cache holds tok_emb and lm_head each (safetensors has no
    shared tensors): the dry run's estimate (sweeps.plan.build) adds the copy and matches the
    file within its header."""
    from moe_core.hf import load_dense
    from moe_core.params import count_params
    from sweeps.plan.build import tied_copy_bytes

    src = tiny_dense("llama", tmp_path / "tied", tie=True)
    cfg, _ = load_dense(src)
    assert cfg.tie_embeddings
    cache = tmp_path / "cache" / "hf-tied"
    load_pretrained_parent(src, cache)
    est = count_params(cfg).total * 4 + tied_copy_bytes(cfg)
    got = (cache / "model.safetensors").stat().st_size
    assert tied_copy_bytes(cfg) == cfg.vocab_size * cfg.d_model * 4
    assert 0.97 < est / got <= 1.0, (est, got)

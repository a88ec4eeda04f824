"""Weights follow the umask, secrets do not (issue 37 item 8): under umask 022 a training
checkpoint, the parent cache and a Hugging Face export (safetensors' ``save_file`` and
``torch.save`` create 0600 files) come out 0644 in 0755 folders, so teammates on shared storage
can read them; the HMAC key and the W&B netrc stay 0600 whatever the umask."""

from __future__ import annotations

import os
import shutil
import stat

import pytest
import torch

from moe_core.hf import save_moe
from moe_core.train.checkpoint import save_checkpoint
from moe_core.train.runner import load_pretrained_parent
from tests.hf_util import tiny_dense


@pytest.fixture
def umask_022():
    old = os.umask(0o022)
    yield
    os.umask(old)


def _modes(folder):
    out = {f.name: stat.S_IMODE(f.stat().st_mode) for f in folder.iterdir()}
    out["."] = stat.S_IMODE(folder.stat().st_mode)
    return out


def test_checkpoints_parent_cache_and_exports_are_0644(tmp_path, umask_022):
    ck = save_checkpoint(tmp_path / "step_2", model_state={"w": torch.ones(3)},
                         optimizer_state={"state": {}, "param_groups": []}, meta={"step": 2})
    src = tiny_dense("llama", tmp_path / "llama")
    load_pretrained_parent(src, tmp_path / "cache" / "hf-abc")
    from moe_core.hf import load_dense

    cfg, state = load_dense(src)
    save_moe(state, cfg, tmp_path / "export")
    for folder in (ck, tmp_path / "cache" / "hf-abc", tmp_path / "export"):
        modes = _modes(folder)
        assert modes.pop(".") == 0o755 and set(modes.values()) == {0o644}, (folder, modes)
    assert {"model.safetensors", "optim_rank0.pt"} <= set(os.listdir(ck))


def test_secrets_stay_0600_whatever_the_umask(tmp_path, monkeypatch):
    from sweeps.store.signing import KEY_ENV, KEY_FILE_ENV, key_file, load_key
    from sweeps.store.trust import hide_wandb_key

    monkeypatch.delenv(KEY_ENV, raising=False)
    monkeypatch.setenv(KEY_FILE_ENV, str(tmp_path / "keys" / "hmac.key"))
    monkeypatch.setenv("WANDB_API_KEY", "k" * 40)
    monkeypatch.delenv("NETRC", raising=False)
    old = os.umask(0o000)
    try:
        assert len(load_key()) == 32
        assert stat.S_IMODE(key_file().stat().st_mode) == 0o600
        assert str(key_file()).startswith(str(tmp_path))
        netrc = hide_wandb_key()
        assert stat.S_IMODE(netrc.stat().st_mode) == 0o600
        shutil.rmtree(netrc.parent)
    finally:
        os.umask(old)

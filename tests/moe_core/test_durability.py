"""Durable writes: unique temporary names, concurrent savers of one path, parent keys that see
the data on disk, errors that cross process boundaries."""

from __future__ import annotations

import pickle
import time

import pytest
import torch

from moe_core.data import DataConfig, data_fingerprint
from moe_core.errors import DivergenceError
from moe_core.fsio import atomic_write_text, publish_dir
from moe_core.train.checkpoint import load_checkpoint, save_checkpoint
from tests.ranks import pool


def test_divergence_error_pickles():
    e = pickle.loads(pickle.dumps(DivergenceError(7, "loss is nan")))
    assert isinstance(e, DivergenceError) and e.step == 7 and e.reason == "loss is nan"
    assert str(e) == "diverged at step 7: loss is nan"


def _save_many(args):
    path, seed, n = args
    errors = 0
    for i in range(n):
        try:
            save_checkpoint(path, model_state={"w": torch.full((64,), float(seed * 1000 + i))},
                            optimizer_state=None, meta={"step": i, "writer": seed})
        except Exception:  # noqa: BLE001 - counted: the test wants none
            errors += 1
    return errors


@pytest.mark.slow
def test_concurrent_checkpoint_saves_to_one_path_never_collide(tmp_path):
    path = tmp_path / "ck"
    with pool(4) as workers:
        errors = workers.map(_save_many, [(path, s, 20) for s in range(4)])
    assert errors == [0, 0, 0, 0]
    ck = load_checkpoint(path)  # whole and verified: one writer's last save
    w = ck.model_state()["w"]
    assert torch.all(w == w[0]) and int(w[0]) % 1000 == 19
    leftovers = [p.name for p in tmp_path.iterdir() if p.name != "ck"]
    assert leftovers == []


def test_atomic_write_and_publish_leave_no_temporary(tmp_path):
    atomic_write_text(tmp_path / "a.json", "{}")
    atomic_write_text(tmp_path / "a.json", '{"x": 1}')
    d = tmp_path / "new"
    d.mkdir()
    (d / "f").write_text("1")
    publish_dir(d, tmp_path / "dir")
    d2 = tmp_path / "new2"
    d2.mkdir()
    (d2 / "f").write_text("2")
    publish_dir(d2, tmp_path / "dir")  # replaces the earlier one
    assert (tmp_path / "a.json").read_text() == '{"x": 1}'
    assert (tmp_path / "dir" / "f").read_text() == "2"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json", "dir"]


def test_data_fingerprint_sees_a_changed_corpus(tmp_path):
    f = tmp_path / "corpus.txt"
    f.write_text("hello world " * 2000)
    cfg = DataConfig(source="text", path=str(f))
    a = data_fingerprint(cfg)
    assert data_fingerprint(cfg) == a  # stable
    time.sleep(0.01)
    f.write_text("other words " * 2000)  # same size, same path, new content
    assert data_fingerprint(cfg) != a
    assert data_fingerprint(DataConfig(source="synthetic")) == "synthetic"


def test_parent_key_covers_the_data(tmp_path):
    from moe_core.train import train_config_from_dict
    from moe_core.train.runner import parent_key

    f = tmp_path / "corpus.txt"
    f.write_text("abc " * 5000)
    cfg = train_config_from_dict({
        "model": {"preset": "debug"}, "data": {"source": "text", "path": str(f)},
        "moe": {"num_experts": 4, "top_k": 2}, "parent": {"tokens": 1000},
    })
    k1 = parent_key(cfg)
    f.write_text("xyz " * 5000)
    assert parent_key(cfg) != k1
    with pytest.raises(Exception, match="no .txt files|does not exist"):
        f.unlink()
        parent_key(cfg)

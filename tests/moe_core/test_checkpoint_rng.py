"""Checkpoints hold the CPU generator's state and, on CUDA, every device's generator state
(``cuda_rng_rank{r}.pt``, checksummed like the rest); restoring sets both. Checkpoints written
before (or without CUDA) have no CUDA file and still restore. On this CPU machine the CUDA
calls are replaced by recorders of what would be saved and set (no GPU is asked)."""

import json

import torch

from moe_core.train.checkpoint import load_checkpoint, save_checkpoint


def _save(path):
    return save_checkpoint(path, model_state={"w": torch.zeros(2)}, optimizer_state=None,
                           meta={"step": 3})


class FakeCuda:
    """What ``torch.cuda`` would hold on a machine with ``n`` devices (one state each)."""

    def __init__(self, monkeypatch, n: int):
        self.states = [torch.randint(0, 255, (16,), dtype=torch.uint8) for _ in range(n)]
        self.set: dict[int, torch.Tensor] = {}
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: n)
        monkeypatch.setattr(torch.cuda, "get_rng_state_all", lambda: list(self.states))
        monkeypatch.setattr(torch.cuda, "set_rng_state",
                            lambda s, device: self.set.__setitem__(device, s.clone()))


def test_cpu_checkpoint_restores_the_cpu_generator_and_has_no_cuda_file(tmp_path):
    torch.manual_seed(7)
    path = _save(tmp_path / "c")
    expected = torch.rand(4)
    ck = load_checkpoint(path)
    assert "cuda_rng_rank0" not in ck.meta["files"] and ck.cuda_rng_state() is None
    torch.rand(10)  # move on, then come back
    ck.restore_rng()
    assert torch.equal(torch.rand(4), expected)


def test_cuda_generators_are_saved_checksummed_and_restored(tmp_path, monkeypatch):
    cuda = FakeCuda(monkeypatch, n=2)
    path = _save(tmp_path / "c")
    meta = json.loads((path / "meta.json").read_text())
    assert meta["files"]["cuda_rng_rank0"] == "cuda_rng_rank0.pt"
    assert "cuda_rng_rank0.pt" in meta["sha256"]
    ck = load_checkpoint(path)
    assert all(torch.equal(a, b) for a, b in zip(ck.cuda_rng_state(), cuda.states))
    ck.restore_rng()
    assert sorted(cuda.set) == [0, 1]
    assert all(torch.equal(cuda.set[d], cuda.states[d]) for d in (0, 1))


def test_restore_sets_only_the_devices_both_sides_have(tmp_path, monkeypatch):
    FakeCuda(monkeypatch, n=2)
    path = _save(tmp_path / "c")
    fewer = FakeCuda(monkeypatch, n=1)  # resumed in a process that sees one GPU
    load_checkpoint(path).restore_rng()
    assert sorted(fewer.set) == [0]


def test_old_checkpoint_without_cuda_state_restores_on_cuda(tmp_path, monkeypatch):
    torch.manual_seed(3)
    path = _save(tmp_path / "old")  # written on CPU, as every checkpoint before this change
    expected = torch.rand(3)
    cuda = FakeCuda(monkeypatch, n=1)
    load_checkpoint(path).restore_rng()
    assert cuda.set == {} and torch.equal(torch.rand(3), expected)

"""A multi-rank checkpoint whose ranks share no folder (ranks on different nodes,
``save_checkpoint(gather=...)``): each rank writes and publishes only its own files in its own
folder, rank 0's folder also holds ``meta.json`` listing every rank's files with their
checksums, one rank's folder alone is refused as incomplete, and the folders joined (as a
checkpoint upload to shared storage joins them) load and verify. Two ranks are two threads
here; ``gather`` is an all-gather through a barrier, as ``torch.distributed.all_gather_object``
is across processes."""

import shutil
import threading

import pytest
import torch

from moe_core.errors import CheckpointError
from moe_core.train.checkpoint import load_checkpoint, save_checkpoint


def _two_ranks_save(folders, per_rank_model=True):
    world = len(folders)
    slots: list = [None] * world
    sync = threading.Barrier(world)
    errors: list = []

    def gather_for(rank):
        def gather(obj):
            slots[rank] = obj
            sync.wait()
            out = list(slots)
            sync.wait()  # nobody overwrites a slot before everyone has read it
            return out
        return gather

    def rank_main(rank):
        try:
            save_checkpoint(folders[rank], model_state={"w": torch.full((2,), float(rank))},
                            optimizer_state={"m": torch.full((3,), 10.0 + rank)},
                            meta={"step": 6}, rank=rank, world_size=world,
                            per_rank_model=per_rank_model, barrier=sync.wait,
                            gather=gather_for(rank))
        except BaseException as e:  # noqa: BLE001 - re-raised in the test's thread
            errors.append(e)
            sync.abort()

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    if errors:
        raise errors[0]


def test_ranks_without_a_shared_folder_write_their_own_files_and_rank0_the_manifest(tmp_path):
    folders = [tmp_path / f"node{r}" / "step_00000006" for r in range(2)]
    _two_ranks_save(folders)
    own = [{p.name for p in f.iterdir()} for f in folders]
    assert own[0] == {"meta.json", "model_rank0.safetensors", "optim_rank0.pt", "rng_rank0.pt"}
    assert own[1] == {"model_rank1.safetensors", "optim_rank1.pt", "rng_rank1.pt"}
    assert not list(folders[0].parent.glob(".tmp-*")) and not list(folders[1].parent.glob(".tmp-*"))

    with pytest.raises(CheckpointError, match="missing model_rank1.safetensors"):
        load_checkpoint(folders[0])  # rank 0's folder alone is not the checkpoint

    joined = tmp_path / "bucket" / "checkpoint_000001"
    for f in folders:
        shutil.copytree(f, joined, dirs_exist_ok=True)
    ck = load_checkpoint(joined)  # every rank's file verified against rank 0's manifest
    assert ck.meta["world_size"] == 2 and ck.meta["step"] == 6
    assert set(ck.meta["files"]) == {"model_rank0", "model_rank1", "optim_rank0",
                                     "optim_rank1", "rng_rank0", "rng_rank1"}
    assert torch.equal(ck.optimizer_state(1)["m"], torch.full((3,), 11.0))


def test_a_rank_file_changed_after_the_manifest_is_refused(tmp_path):
    folders = [tmp_path / f"node{r}" / "step_00000006" for r in range(2)]
    _two_ranks_save(folders, per_rank_model=False)
    assert not (folders[1] / "model.safetensors").exists()  # the model is rank 0's alone
    joined = tmp_path / "joined"
    for f in folders:
        shutil.copytree(f, joined, dirs_exist_ok=True)
    torch.save({"m": torch.zeros(3)}, joined / "optim_rank1.pt")
    with pytest.raises(CheckpointError, match="checksum mismatch"):
        load_checkpoint(joined)

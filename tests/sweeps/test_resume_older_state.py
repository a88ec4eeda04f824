"""``--resume`` of Tune state pickled by an older upcycle-sweeps whose classes moved is one
line, not a traceback: the real unpickling error of a pickle that names a class this version no
longer has (``sweeps.spec.Param``), raised through Tune's own restore."""

import pickle
import pickletools

import pytest
from ray import tune

from moe_core.errors import SearchSpaceError
from sweeps.run import driver


def _old_pickle() -> bytes:
    """A pickle naming ``sweeps.spec.Param`` (the class before ``sweeps.space``): a GLOBAL
    opcode for the moved class, as the old experiment state holds it."""
    blob = b"\x80\x02csweeps.spec\nParam\nq\x00)\x81q\x01."
    assert [op.name for op, _, _ in pickletools.genops(blob)][1] == "GLOBAL"
    return blob


def test_unpickling_a_moved_class_fails_as_tune_would_see_it():
    with pytest.raises(driver.OLDER_STATE):
        pickle.loads(_old_pickle())


def test_resume_of_older_state_is_one_line(monkeypatch, tmp_path):
    def restore(*a, **k):
        return pickle.loads(_old_pickle())

    monkeypatch.setattr(tune.Tuner, "restore", staticmethod(restore))
    with pytest.raises(SearchSpaceError, match=r"older upcycle-sweeps: resume with that version"
                       r", or rerun into a new results folder \(nothing was changed\)") as e:
        driver._restore(str(tmp_path), trainable=None, fs=None)
    assert "Param" in str(e.value) and "\n" not in str(e.value)

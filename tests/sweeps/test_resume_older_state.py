"""``--resume`` of Tune state pickled by an older upcycle-sweeps whose classes moved is one
line, not a traceback: the real unpickling error of a pickle that names a class this version no
longer has (``sweeps.spec.Param``; the flat modules before the stage folders, such as
``sweeps.health`` and ``sweeps.trainable``), raised through Tune's own restore."""

import pickle
import pickletools
import sys

import pytest
from ray import tune

from moe_core.errors import SearchSpaceError
from sweeps.run import driver

MOVED = [("sweeps.spec", "Param"),  # before sweeps.space (#29)
         # before the stage folders (#36): what the driver hands Tune, pickled in its state
         ("sweeps.driver", "ResultsCallback"), ("sweeps.health", "ResumableASHA"),
         ("sweeps.health", "HealthStopper"), ("sweeps.trainable", "run_trial")]


def _old_pickle(module: str = "sweeps.spec", name: str = "Param") -> bytes:
    """A pickle naming ``module.name`` (a class this version moved): a GLOBAL opcode for the
    moved class, as the old experiment state holds it."""
    blob = b"\x80\x02c" + f"{module}\n{name}\n".encode() + b"q\x00)\x81q\x01."
    assert [op.name for op, _, _ in pickletools.genops(blob)][1] == "GLOBAL"
    return blob


@pytest.fixture(autouse=True)
def _this_checkout_only(monkeypatch):
    """Old names are looked up in this checkout's ``sweeps`` only: an editable install's finder
    (``__editable__…``) maps ``sweeps.X`` into the checkout it was installed from, which on a
    machine with several worktrees may still hold the flat modules."""
    monkeypatch.setattr(sys, "meta_path", [f for f in sys.meta_path if not getattr(
        f, "__module__", "").startswith("__editable__")])
    for module, _ in MOVED[1:]:  # (sweeps.spec is a package now: kept)
        monkeypatch.delitem(sys.modules, module, raising=False)


@pytest.mark.parametrize("module,name", MOVED)
def test_unpickling_a_moved_class_fails_as_tune_would_see_it(module, name):
    with pytest.raises(driver.OLDER_STATE):
        pickle.loads(_old_pickle(module, name))


@pytest.mark.parametrize("module,name", [MOVED[0], MOVED[2]])
def test_resume_of_older_state_is_one_line(monkeypatch, tmp_path, module, name):
    def restore(*a, **k):
        return pickle.loads(_old_pickle(module, name))

    monkeypatch.setattr(tune.Tuner, "restore", staticmethod(restore))
    with pytest.raises(SearchSpaceError, match=r"older upcycle-sweeps: resume with that version"
                       r", or rerun into a new results folder \(nothing was changed\)") as e:
        driver._restore(str(tmp_path), trainable=None, fs=None)
    assert name in str(e.value) or module in str(e.value)
    assert "\n" not in str(e.value)

"""``--resume`` bound to the folder it resumes, and refused in one line when there is nothing
sound to resume.

``tune/tuner.pkl`` holds our callbacks, stopper and searcher, each with the *absolute* results
folder the run started in, and ``Tuner.restore`` rewrites only Tune's own paths: a copied or
moved folder would be resumed by objects writing into the old one. :func:`rebind` gives the
restored tuner this run's callbacks, stopper and searcher instead (their state is restored from
the experiment folder). :func:`check_tune_state` reads the newest ``experiment_state-*.json``
first: Tune logs a traceback for an unreadable one and silently starts over.
"""

from __future__ import annotations

from typing import Any

import pyarrow.fs as pafs

from moe_core.errors import UpcycleError, shown


class UnsoundStateError(UpcycleError):
    """The experiment state to resume from is missing or unreadable."""


def _refuse(what: str, why: str) -> UnsoundStateError:
    return UnsoundStateError(
        f"--resume: {what} {why}, so the run cannot be resumed as it was; restore the folder "
        "from a copy, or start afresh without --resume (the old run moves to previous/)")


def _unpickle(fs: pafs.FileSystem, path: str, loads: Any, why: str = "") -> Any:
    """``path`` unpickled as Tune reads it (``loads``); refused in one line when unreadable."""
    try:
        with fs.open_input_stream(path) as f:
            return loads(f.read())
    except UpcycleError:  # a signature refused: its own one line
        raise
    except Exception as e:  # noqa: BLE001 - any decoding error: a truncated or garbage file
        raise _refuse(path, f"is unreadable ({type(e).__name__}: {shown(str(e), 120)}){why}") \
            from None


def check_tune_state(where: str, fs: pafs.FileSystem | None) -> str:
    """The newest experiment state file under Tune's folder ``where`` (in ``fs``, local when
    None), read and unpickled as Tune will: refused in one line when absent or unreadable.
    Unpickle only state already checked (``sweeps.store.trust`` locally,
    ``sweeps.store.signing`` on object storage)."""
    from ray.tune.execution.experiment_state import _find_newest_experiment_checkpoint
    from ray.tune.utils.serialization import _loads_with_cloudpickle

    fs = fs or pafs.LocalFileSystem()
    try:
        newest = _find_newest_experiment_checkpoint(where, fs=fs)
    except (OSError, ValueError) as e:
        raise _refuse(where, f"cannot be listed ({type(e).__name__}: {shown(str(e), 120)})") \
            from None
    if newest is None:
        raise _refuse(where, "holds tuner.pkl but no experiment_state-*.json")
    state = _unpickle(fs, newest, _loads_with_cloudpickle)
    if not isinstance(state, dict) or not isinstance(state.get("trial_data"), list) \
            or not isinstance(state.get("runner_data"), dict):
        raise _refuse(newest, "is not Tune experiment state")
    _check_search_state(where, fs)
    return newest


SEARCH_STATE = ("basic-variant-state-", "search_gen_state-", "searcher-state-")
"""The searcher's saved state (Tune's ``CKPT_FILE_TMPL`` of its variant generator, search
generator and searcher): Tune restores the newest of each kind, and on an unreadable one it
logs "Failed to restore the run state" and starts the sweep's search afresh (trials of no
grid point were recorded so in a test): refused here in one line instead. The cause was a
file cut short by Tune's in-place upload; state kept as generations
(``sweeps.store.generations``) never shows such a file (its save is read past), so this
refusal is left to folders written before them."""


def _check_search_state(where: str, fs: pafs.FileSystem) -> None:
    import ray.cloudpickle as cloudpickle

    try:
        names = [i.path for i in fs.get_file_info(pafs.FileSelector(where))
                 if i.type == pafs.FileType.File]
    except (OSError, ValueError):
        return  # check_tune_state listed the folder already: nothing new to say
    for prefix in SEARCH_STATE:
        found = sorted(n for n in names if n.rsplit("/", 1)[-1].startswith(prefix))
        if found:  # as Tune reads it (_load_newest_checkpoint)
            _unpickle(fs, found[-1], cloudpickle.loads, "; Tune would restart the search")


def rebind(tuner: Any, callbacks: list[Any], stop: Any, search_alg: Any | None) -> Any:
    """``tuner`` (restored) with this run's ``callbacks`` and ``stop`` (the stopper the results
    callback reseeds: one object, as in a fresh run) and, when given, ``search_alg``, in place
    of those unpickled from ``tuner.pkl`` (which name the folder the run started in). Refused in
    one line if this Ray's Tuner does not keep them where this expects."""
    inner = getattr(tuner, "_local_tuner", None)
    run_config = getattr(inner, "_run_config", None)
    tune_config = getattr(inner, "_tune_config", None)
    if run_config is None or tune_config is None:
        raise UnsoundStateError(
            "--resume: this Ray's Tuner keeps its run config elsewhere, so the restored run "
            "could write into the folder it was started in; use the Ray version in "
            "pyproject.toml")
    run_config.callbacks = callbacks
    run_config.stop = stop
    if search_alg is not None:
        tune_config.search_alg = search_alg
    return tuner

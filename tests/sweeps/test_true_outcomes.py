"""Every recorded outcome is true (issue #32): a trial a stop signal cut is ``interrupted``
(results and summary), never ``ok``; a health rule's pruning survives ``--resume`` as itself,
never relabelled as an ASHA stop. Driven through the driver's own callback and
``reconcile`` with Ray Tune's own ``Trial`` objects."""

from __future__ import annotations

import signal

import yaml
from ray.tune.experiment import Trial

from sweeps.plan.build import build_plan
from sweeps.run.driver import ResultsCallback
from sweeps.run.health import HealthStopper
from sweeps.spec.sweep import load_spec
from sweeps.store.results import final_rows, read_rows, summarize
from sweeps.store.sink import ResultsSink
from sweeps.store.trial_outcomes import reconcile
from tests.sweeps.tiny import tiny_base

SPEC = {
    "sweep": "outcomes",
    "base": tiny_base(moe={"num_experts": 4, "top_k": 2}),
    "search": {"optim.lr": {"grid": [1e-3, 2e-3]}},
    "scheduler": {"kind": "asha", "grace_period": 1, "reduction_factor": 2},
    "prune": {"max_load_fraction": {"above": 0.9, "for_evals": 2}},
    "logging": {"wandb": {"enabled": False}},
}


def _spec(tmp_path):
    f = tmp_path / "spec.yaml"
    f.write_text(yaml.safe_dump(dict(SPEC, results=str(tmp_path / "results"))))
    spec = load_spec(str(f))
    return spec, build_plan(spec)


def _trial(tid: str, lr: float, status: str) -> Trial:
    t = Trial("__fake", trial_id=tid, stub=True, config={"optim.lr": lr})
    t.set_status(status)
    return t


def _row(tid: str, step: int, load: float) -> dict:
    return {"sweep": "outcomes", "trial_id": tid, "step": step, "tokens": step * 256,
            "val_loss": 3.0 - 0.1 * step, "router.max_load": load, "status": "running"}


def test_a_trial_cut_by_a_signal_is_interrupted_not_ok(tmp_path):
    res = tmp_path / "res"
    sink = ResultsSink(res)
    for s in (0, 2):
        sink.add(_row("cut", s, 0.3))
    for s in (0, 2, 4, 6, 8):
        sink.add(_row("done", s, 0.3))
    sink.mark("done", "ok")  # on_trial_complete said so before the signal
    # Tune's cleanup after SIGTERM sets every running trial TERMINATED
    reconcile(sink, [_trial("cut", 1e-3, Trial.TERMINATED),
                     _trial("done", 2e-3, Trial.TERMINATED)], signal.SIGTERM)
    sink.close()
    finals = {r["trial_id"]: r for r in final_rows(read_rows(res / "results.parquet"))}
    assert finals["cut"]["status"] == "interrupted" and "signal 15" in finals["cut"]["reason"]
    assert finals["done"]["status"] == "ok"
    s = summarize(finals.values(), sweep="s", metric="val_loss", mode="min",
                  planned={"trials": 2, "parents": 0, "tokens_saved_by_sharing": 0,
                           "tokens_saved_by_branches": 0}, results="r", wall_s=1,
                  parent_wall_s=0)
    assert s["ok"] == 1 and s["interrupted"] == 1 and s["complete"] is False
    assert s["unfinished"] == ["cut"]
    # the --resume that finishes it: ok at last
    sink = ResultsSink(res)
    sink.load()
    for s in (4, 6, 8):
        sink.add(_row("cut", s, 0.3))
    reconcile(sink, [_trial("cut", 1e-3, Trial.TERMINATED)])
    sink.close()
    finals = {r["trial_id"]: r for r in final_rows(read_rows(res / "results.parquet"))}
    assert finals["cut"]["status"] == "ok"


def test_health_pruning_survives_resume_and_is_not_called_asha(tmp_path):
    spec, plan = _spec(tmp_path)
    res = spec.results_dir
    cb = ResultsCallback(spec, plan, res, health=HealthStopper(spec.prune))
    t = _trial("pr", 1e-3, Trial.RUNNING)
    for s, load in ((0, 0.95), (2, 0.97)):  # over 0.9 for 2 evals: the rule fires at step 2
        row = _row("pr", s, load)
        assert cb.health("pr", row) is (s == 2)
        cb.on_trial_result(0, [t], t, row)
    cb.sink.close()
    rows = read_rows(res / "results.parquet")
    assert {r["prune_rule"] for r in rows if r["step"] == 2} == {"max_load_fraction"}
    # --resume: Tune restores the stopper and this callback as pickled at the start (empty)
    cb2 = ResultsCallback(spec, plan, res, health=HealthStopper(spec.prune))
    cb2.setup()
    assert cb2.health.verdict("pr") is not None  # reseeded from the recorded rows
    t.set_status(Trial.TERMINATED)
    cb2.on_trial_complete(0, [t], t)
    cb2.sink.close()
    final = final_rows(read_rows(res / "results.parquet"))[0]
    assert final["status"] == "pruned" and final["prune_rule"] == "max_load_fraction"
    assert "asha" not in (final["reason"] or "").lower()


def test_recorded_health_prune_is_kept_without_the_stopper(tmp_path):
    """Even with a stopper that knows nothing (its state lost), the completion keeps the rule
    the rows recorded instead of calling it an ASHA stop."""
    spec, plan = _spec(tmp_path)
    cb = ResultsCallback(spec, plan, spec.results_dir, health=None)
    t = _trial("pr", 1e-3, Trial.TERMINATED)
    cb.on_trial_result(0, [t], t, _row("pr", 0, 0.95))
    cb.on_trial_result(0, [t], t, {**_row("pr", 2, 0.97), "prune_rule": "max_load_fraction",
                                   "prune_metric": "router.max_load", "prune_value": 0.97,
                                   "prune_threshold": 0.9, "prune_step": 2,
                                   "reason": "pruned by max_load_fraction"})
    cb.on_trial_complete(0, [t], t)
    cb.sink.close()
    final = final_rows(read_rows(spec.results_dir / "results.parquet"))[0]
    assert final["status"] == "pruned" and final["prune_rule"] == "max_load_fraction"


def test_netrc_left_by_a_killed_driver_is_cleaned_by_the_next(tmp_path, monkeypatch):
    import subprocess
    import sys
    import tempfile

    from sweeps.store import trust

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    code = ("import os, sys; os.environ['WANDB_API_KEY'] = 'k-123'; import tempfile; "
            f"tempfile.tempdir = {str(tmp_path)!r}; from sweeps.store.trust import hide_wandb_key; "
            "print(hide_wandb_key(), flush=True); os.kill(os.getpid(), 9)")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=120)
    left = list(tmp_path.glob("upcycle-wandb-*"))
    assert p.returncode == -9 and len(left) == 1 and "k-123" in (left[0] / "netrc").read_text()
    monkeypatch.setenv("WANDB_API_KEY", "k-456")
    monkeypatch.delenv("NETRC", raising=False)
    mine = trust.hide_wandb_key()  # the next run
    assert not left[0].exists() and mine.exists()
    assert trust.clean_stale_netrc(tmp_path) == []  # its own (alive) folder stays
    import shutil
    shutil.rmtree(mine.parent)

"""What a sweep's W&B runs hold (``sweeps.run.wandb_logging``, ``sweeps.store.wandb_keys``):
the trial's knobs, effective values and provenance as the run config, nested by YAML path; the
metrics at each eval with per-layer MoE health under ``health/layer<i>/<stat>``; the run in the
sweep's group. The offline run is read back with wandb's own reader (``wandb leet inspect``)
and checked against the Parquet. (A real sweep's runs: tests/sweeps/test_sweep_e2e.py.)"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from sweeps.store import provenance as pv
from sweeps.store.results import encode_value, read_rows, write_rows
from sweeps.store.wandb_keys import health_stats, lookup, metric_key, nest, wandb_result
from tests.sweeps.wandb_files import mismatches, read_offline_run


class _Trial(SimpleNamespace):
    """A stand-in for Tune's ``Trial``, which callbacks key dicts by: hashable by identity."""

    __hash__ = object.__hash__


STATIC = ("sweep", "trial_id", "kind", "seed", "N1", "optim.lr", "upcycle.lr_policy",
          "upcycle.lr_policy.policy", "upcycle.lr_policy.peak", "parent.moe")


def test_per_layer_health_is_namespaced_by_layer():
    cols = ["router.max_load", "router.max_load.layer3", "router.max_load.worst",
            "router.entropy", "val_loss", "compile.graphs"]
    stats = health_stats(cols)
    assert stats == {"max_load"}
    assert [metric_key(c, stats) for c in cols] == [
        "health/all/max_load", "health/layer3/max_load", "health/worst/max_load",
        "router.entropy", "val_loss", "compile.graphs"]


def test_config_nests_by_yaml_path_and_keeps_what_cannot_nest():
    flat = {"upcycle.lr_policy": {"policy": "reset"}, "upcycle.lr_policy.peak": 1e-3,
            "upcycle.lr_policy.policy": "reset", "parent.moe": None,
            "parent.moe.num_experts": 4, "seed": 0, "seed.x": 1}
    got = nest(flat)
    assert got == {"upcycle": {"lr_policy": {"policy": "reset", "peak": 1e-3}},
                   "parent": {"moe": {"num_experts": 4}}, "seed": 0, "seed.x": 1}
    assert all(lookup(got, k) == v for k, v in flat.items()
               if v is not None and not isinstance(v, dict))
    assert lookup(got, "upcycle.lr_policy").items() >= {"policy": "reset"}.items()
    result = {"val_loss": 2.0, "router.max_load.layer0": 0.5, "router.max_load.worst": 0.5,
              "knob.optim.lr": 1e-3, "effective.optim.lr": 1e-3, "sweep": "s",
              "config": {"optim.lr": 1e-3}}
    out = wandb_result(result, {"sweep"})
    assert out == {"val_loss": 2.0, "health/layer0/max_load": 0.5, "health/worst/max_load": 0.5,
                   "config": {"optim": {"lr": 1e-3}, "knob": {"optim": {"lr": 1e-3}},
                              "effective": {"optim": {"lr": 1e-3}}, "sweep": "s"}}
    assert "config" in result and "knob.optim.lr" in result  # the callbacks' result untouched


def _results(trial: str, lr: float) -> list[dict]:
    """A trial's Tune results as the trial reports them (Tune adds its own keys)."""
    out = []
    for i, step in enumerate((0, 2, 4)):
        layer1 = 0.4 + 0.2 * i  # layer 1 collapses: its max load rises
        out.append({
            "sweep": "wb", "trial_id": trial, "kind": "upcycled", "seed": 0, "N1": 1000,
            "optim.lr": lr, "upcycle.lr_policy": {"policy": "reset", "peak": lr},
            "upcycle.lr_policy.policy": "reset", "upcycle.lr_policy.peak": lr,
            "parent.moe": None, "knob.optim.lr": lr,
            "knob.upcycle.lr_policy": encode_value({"policy": "reset", "peak": lr}),
            "effective.optim.lr": lr * 0.1, "effective.moe.top_k": 2,
            "step": step, "tokens": 256 * step, "val_loss": 3.0 - 0.1 * i - lr,
            "train_loss": None if step == 0 else 2.9 - 0.1 * i, "compile.limit_hit": False,
            "router.max_load": (0.3 + layer1) / 2, "router.max_load.layer0": 0.3,
            "router.max_load.layer1": layer1, "router.max_load.worst": layer1,
            "router.dead_experts.layer0": 0.0, "router.dead_experts.layer1": float(i),
            "router.dead_experts.worst": float(i), "router.dead_experts": i / 2,
            "training_iteration": i + 1, "time_this_iter_s": 0.1,
            "config": {"optim.lr": lr, "upcycle.lr_policy": {"policy": "reset", "peak": lr}},
        })
    return out


class _ListQueue:
    def __init__(self, items):
        self.items = list(items)

    def get(self):
        return self.items.pop(0)


@pytest.mark.slow  # two wandb-core processes (the run's, the reader's): ~3 s CPU, 7-14 s wall
def test_an_offline_run_reads_back_as_its_parquet_rows(tmp_path, monkeypatch):
    """The logger's config and results, through Ray's own logging actor (in this process, not
    as a Ray actor) into an offline wandb run; read back, it matches the Parquet's rows."""
    from ray.air.integrations.wandb import WandbLoggerCallback, _QueueItem

    from sweeps.run.wandb_logging import ProvenanceWandbLogger, StepLoggingActor

    started, logged = {}, []
    monkeypatch.setattr(WandbLoggerCallback, "_start_logging_actor",
                        lambda self, trial, exclude, **kw: started.update(kw, exclude=exclude))
    monkeypatch.setattr(WandbLoggerCallback, "log_trial_result",
                        lambda self, it, trial, result: logged.append(result))
    monkeypatch.setenv("WANDB_SILENT", "true")
    cb = ProvenanceWandbLogger(project="p", group="wb", mode="offline", dir=str(tmp_path),
                               static=STATIC)
    results = _results("t0", 1e-3)
    # a trial restored from a checkpoint reports fewer effective values (the knobs read on the
    # step-0 weights are not read again): the run config keeps what it had
    del results[2]["effective.moe.top_k"]
    trial = _Trial(config=dict(results[0]["config"]), trial_id="t0",
                   experiment_dir_name="x", local_path=str(tmp_path))
    cb.log_trial_start(trial)
    for r in results:
        cb.log_trial_result(r["training_iteration"], trial, r)
    assert started["config"]["provenance"] == pv.provenance()
    assert started["config"]["optim"] == {"lr": 1e-3}  # nested by YAML path

    exclude = started.pop("exclude")
    monkeypatch.chdir(tmp_path)  # Ray's actor changes directory into the trial's folder
    queue = _ListQueue([*((_QueueItem.RESULT, r) for r in logged), (_QueueItem.END, None)])
    StepLoggingActor(str(tmp_path), queue, exclude, cb.AUTO_CONFIG_KEYS, **started).run()

    rows = [{k: v for k, v in r.items() if k not in ("config", "training_iteration",
                                                      "time_this_iter_s")} for r in results]
    write_rows(tmp_path / "results.parquet", rows)
    parquet = read_rows(tmp_path / "results.parquet")
    (run_dir,) = (tmp_path / "wandb").glob("offline-run-*")
    run = read_offline_run(run_dir)
    assert (run.run_id, run.group, run.project, run.exit_code) == ("t0", "wb", "p", 0)
    assert mismatches(run, parquet, STATIC) == []
    assert parquet[2]["effective.moe.top_k"] is None
    assert [h["health/layer1/max_load"] for h in run.history] == [0.4, 0.6000000000000001, 0.8]
    assert run.config["effective"] == {"optim": {"lr": 1e-3 * 0.1}, "moe": {"top_k": 2}}
    assert run.config["provenance"]["code"] == pv.provenance()["code"]
    # the check can fail: a row that differs from the run is named
    parquet[1]["router.max_load.layer1"] = 0.55
    parquet[2]["effective.optim.lr"] = 1.0
    assert mismatches(run, parquet, STATIC) == [
        "step 2 health/layer1/max_load: 0.6000000000000001 != 0.55",
        "config effective.optim.lr: 0.0001 != 1.0"]


def test_a_run_config_accumulates_over_results():
    from sweeps.store.wandb_keys import merged

    old = {"effective": {"moe": {"top_k": 2}, "optim": {"lr": 1.0}}, "seed": 0}
    new = {"effective": {"optim": {"lr": 0.5}}, "trial_id": "t"}
    assert merged(old, new) == {"effective": {"moe": {"top_k": 2}, "optim": {"lr": 0.5}},
                                "seed": 0, "trial_id": "t"}
    assert old["effective"]["optim"] == {"lr": 1.0}  # neither side is changed
    assert merged({"a": {"b": 1}}, {"a": 3}) == {"a": 3}  # a leaf replaces a folder



@pytest.mark.parametrize("spec_wandb, env, on", [
    ({}, None, True), ({}, "offline", True), ({}, "disabled", False),
    ({"mode": "disabled"}, None, False), ({"enabled": False}, "online", False)])
def test_wandb_mode_disabled_in_the_environment_turns_logging_off(monkeypatch, spec_wandb, env,
                                                                  on):
    """``WANDB_MODE=disabled`` is W&B's own off switch; the spec's mode (passed to wandb.init)
    must not override it, nor may the environment turn on what the spec turned off."""
    from sweeps.run.driver import wandb_on
    from sweeps.spec.sweep import parse_spec
    from tests.sweeps.tiny import tiny_base

    if env is None:
        monkeypatch.delenv("WANDB_MODE", raising=False)
    else:
        monkeypatch.setenv("WANDB_MODE", env)
    spec = parse_spec({"sweep": "w", "base": tiny_base(), "logging": {"wandb": spec_wandb}})
    assert wandb_on(spec) is on

"""sweeps.plan.preflight: what --dry-run (and every launch) refuses before any work, one line
each."""

from __future__ import annotations

import json
import os

import pytest
import yaml

from sweeps.plan import preflight
from sweeps.plan.build import build_plan
from sweeps.run.cli import main
from sweeps.spec.sweep import parse_spec
from tests.sweeps.tiny import tiny_base


def _spec(tmp_path, base=None, **top):
    raw = {"sweep": "pf", "base": base or tiny_base(), "results": str(tmp_path / "r"),
           "search": {"optim.lr": {"grid": [1e-3, 3e-3]}},
           "logging": {"wandb": {"enabled": False}}, **top}
    return parse_spec(raw)


def _cli(tmp_path, capsys, spec: dict, *args: str) -> tuple[int, list[str], str]:
    f = tmp_path / "spec.yaml"
    f.write_text(yaml.safe_dump({"sweep": "pf", "results": str(tmp_path / "r"),
                                 "logging": {"wandb": {"enabled": False}}, **spec}))
    rc = main([str(f), "--dry-run", *args])
    cap = capsys.readouterr()
    return rc, [x for x in cap.err.splitlines() if x.strip()], cap.out


def test_missing_data_path_is_refused_by_dry_run_in_one_line(tmp_path, capsys):
    base = tiny_base(data={"source": "tokens", "path": str(tmp_path / "typo.bin"),
                           "seq_len": 32})
    rc, err, _ = _cli(tmp_path, capsys, {"base": base,
                                         "search": {"optim.lr": {"grid": [1e-3]}}})
    assert rc == 2
    assert len(err) == 1, err
    assert err[0].startswith("error: base.data.path: ") and "typo.bin does not exist" in err[0]


def test_searched_data_path_names_the_search_key(tmp_path):
    good = tmp_path / "ok.bin"
    good.write_bytes(b"\0" * 4000)
    base = tiny_base(data={"source": "tokens", "path": str(good), "seq_len": 32})
    spec = _spec(tmp_path, base, search={"data.path": {"grid": [str(good),
                                                                str(tmp_path / "no.bin")]}})
    probs = preflight.run_checks(spec, build_plan(spec))
    assert [p.key for p in probs] == ["search.data.path"]
    assert "no.bin does not exist" in probs[0].message


def test_token_folder_needs_train_and_val(tmp_path):
    d = tmp_path / "toks"
    d.mkdir()
    (d / "train.bin").write_bytes(b"\0" * 4000)
    spec = _spec(tmp_path, tiny_base(data={"source": "tokens", "path": str(d), "seq_len": 32}))
    probs = preflight.run_checks(spec, build_plan(spec))
    assert len(probs) == 1 and "val.bin does not exist" in probs[0].message


def test_calibration_path_is_checked(tmp_path):
    spec = _spec(tmp_path, scheduler={"kind": "asha", "rung_metric": "predicted_final",
                                      "calibration": str(tmp_path / "nowhere")})
    probs = preflight.check_calibration(spec)
    assert [p.key for p in probs] == ["scheduler.calibration"]


@pytest.mark.slow
def test_byte_tokenizer_must_fit_the_checkpoint_vocabulary(tmp_path):
    from tests.hf_util import tiny_dense  # a random Llama with a 97-token vocabulary

    path = tiny_dense("llama", tmp_path / "llama")
    base = {"moe": {"num_experts": 4, "top_k": 2}, "parent": {"from_pretrained": str(path)},
            "data": {"source": "stdlib", "tokenizer": "bytes", "seq_len": 16},
            "batch": {"global_batch": 4, "micro_batch": 4}, "tokens": 256,
            "upcycle": {"method": "dense_to_moe"}}
    spec = _spec(tmp_path, base)
    probs = preflight.run_checks(spec, build_plan(spec))
    assert [p.key for p in probs] == ["base.data.tokenizer"], probs
    assert "256" in probs[0].message and "97 rows" in probs[0].message and probs[0].fatal
    # a 32-symbol synthetic stream fits the 97 rows: nothing to say
    base["data"] = {"source": "synthetic", "synthetic_vocab": 32, "seq_len": 16}
    spec = _spec(tmp_path, base)
    assert preflight.run_checks(spec, build_plan(spec)) == []
    # token files: their largest id must index the embedding too
    import numpy as np

    np.array([1, 96], dtype=np.uint16).repeat(100).tofile(tmp_path / "ok.bin")
    np.array([1, 300], dtype=np.uint16).repeat(100).tofile(tmp_path / "big.bin")
    for f, n in (("ok.bin", 0), ("big.bin", 1)):
        base["data"] = {"source": "tokens", "path": str(tmp_path / f), "seq_len": 16}
        probs = preflight.run_checks(_spec(tmp_path, base), build_plan(_spec(tmp_path, base)))
        assert len(probs) == n and all("largest token id in data.path (300)" in p.message
                                       for p in probs), probs
    base["data"] = {"source": "synthetic", "synthetic_vocab": 32, "seq_len": 16}
    # weight files that do not match config.json: refused before any trial loads them
    cfg = json.loads((path / "config.json").read_text())
    cfg["num_hidden_layers"] = 3
    (path / "config.json").write_text(json.dumps(cfg))
    probs = preflight.run_checks(_spec(tmp_path, base), build_plan(_spec(tmp_path, base)))
    assert any("2 layers" in p.message and "num_hidden_layers=3" in p.message for p in probs)


def test_disk_and_host_memory_estimates_against_the_machine(tmp_path):
    spec = _spec(tmp_path)
    plan = build_plan(spec)
    assert preflight.check_capacity(spec, plan, free_disk=10**15, host_memory=10**15) == []
    probs = preflight.check_capacity(spec, plan, free_disk=1000, host_memory=1000)
    assert [p.key for p in probs] == ["results", "max_concurrent"]
    assert "1000 B free" in probs[0].message and "no single knob" in probs[1].message
    # a GPU forecast checks one trial against the accelerator's memory instead
    big = _spec(tmp_path, tiny_base(model={"preset": "1B"},
                                    batch={"global_batch": 64, "micro_batch": 64},
                                    data={"source": "synthetic", "seq_len": 2048,
                                          "synthetic_vocab": 32}))
    probs = preflight.check_capacity(big, build_plan(big), gpu="l4", free_disk=10**15)
    assert [p.key for p in probs] == ["resources.gpus"] and "NVIDIA L4" in probs[0].message


def test_trial_memory_estimate_by_hand():
    spec_base = tiny_base()
    cfg = parse_spec({"sweep": "m", "base": spec_base}).base_config
    m = cfg.model_config()
    from moe_core.params import count_params

    n = count_params(m).total
    s, b, h, a, L, V = 32, 8, m.d_model, m.n_head, m.n_layer, m.vocab_size
    act = s * b * h * (34 + 5 * a * s / h) * L * 2  # Korthikanti Eq. 2, fp32 doubles it
    # weights 4 + gradients 4 + AdamW 8 + DeepSpeed's flat reduction bucket 4 (B/param)
    model = int(n * 20 + act + 2 * s * b * V * 4)
    assert preflight.trial_memory_bytes(cfg, 0) == preflight.RUNTIME_BYTES + model  # no parent
    from sweeps.plan.memory import model_memory_parts

    gpu = model_memory_parts(cfg, 1)  # bf16 on a GPU, ZeRO 0: auto is torch_autocast
    assert (gpu["weights"], gpu["master"], gpu["gradients"]) == (4 * n, 0, 4 * n)
    ds = parse_spec({"sweep": "m", "base": {**spec_base, "optim": {
        **spec_base.get("optim", {}), "bf16_mode": "deepspeed"}}}).base_config
    wrapped = model_memory_parts(ds, 1)  # bf16 weights and DeepSpeed's fp32 master
    assert (wrapped["weights"], wrapped["master"], wrapped["gradients"]) == (2 * n, 4 * n, 2 * n)
    assert gpu["activations"] == wrapped["activations"]  # bf16 compute either way


def test_custom_resources_must_exist(tmp_path):
    spec = _spec(tmp_path, resources={"trial_driver": 0.01})
    assert preflight.custom_resources(spec) == {"trial_driver": 0.01}
    assert preflight.trial_bundle(spec) == {"CPU": 1.0, "GPU": 0.0, "trial_driver": 0.01}
    probs = preflight.check_cluster(spec, [{"CPU": 8.0}, {"CPU": 4.0, "GPU": 1.0}])
    assert [p.key for p in probs] == ["resources.trial_driver"]
    assert preflight.check_cluster(spec, [{"CPU": 0.0, "trial_driver": 4.0},
                                          {"CPU": 8.0}], fit=False) == []
    # a fixed set of nodes must also hold a whole trial bundle on one node
    probs = preflight.check_cluster(spec, [{"CPU": 0.0, "trial_driver": 4.0}, {"CPU": 8.0}])
    assert [p.key for p in probs] == ["resources"]
    # a CPU trial larger than every node's memory
    probs = preflight.check_cluster(spec, [{"CPU": 8.0, "trial_driver": 1.0, "memory": 1e9}],
                                    trial_bytes=2 * 10**9)
    assert [p.key for p in probs] == ["resources"] and "1.9 GiB" in probs[0].message
    # a local run (no --address) has no custom resources: refused instead of waiting forever
    probs = preflight.run_checks(spec, build_plan(spec))
    assert [p.key for p in probs] == ["resources.trial_driver"]
    with pytest.raises(Exception, match="resources.trial_driver=-1"):
        _spec(tmp_path, resources={"trial_driver": -1})


def test_enforce_prints_one_line_per_problem_and_raises_the_last(tmp_path):
    lines: list[str] = []
    probs = [preflight.Problem("a", "first"), preflight.Problem("b", "careful", fatal=False),
             preflight.Problem("c", "last")]
    with pytest.raises(Exception, match="^c: last$"):
        preflight.enforce(probs, lines.append)
    assert lines == ["error: a: first", "warning: b: careful"]
    preflight.enforce([probs[1]], lines.append)  # a warning alone does not stop anything


def test_results_dir_must_be_writable(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    os.chmod(ro, 0o500)
    try:
        if os.access(ro, os.W_OK):
            pytest.skip("running as root: every folder is writable")
        spec = _spec(tmp_path, results=str(ro / "sub"))
        assert [p.key for p in preflight.check_results_dir(spec)] == ["results"]
    finally:
        os.chmod(ro, 0o700)


def test_a_refusal_names_the_knobs_that_make_it_fit_with_their_figures(tmp_path):
    """#39 item 4: the host-memory refusal names max_concurrent, batch.micro_batch and (several
    ranks) optim.zero_stage, each with the memory it gives; the disk refusal checkpoint.keep
    and max_concurrent."""
    from sweeps.plan.build import DiskEstimate
    from sweeps.plan.memory import memory_fixes, trial_memory_bytes, with_micro_batch
    from sweeps.run.console import human_bytes

    spec = _spec(tmp_path)
    plan = build_plan(spec)
    cfg = plan.trials[0].config
    one, small = trial_memory_bytes(cfg, 0), trial_memory_bytes(with_micro_batch(cfg, 4), 0)
    assert small < one
    # room for one trial, not two: max_concurrent 1; two trials at micro-batch 4 fit too
    host = 2 * small + 1
    probs = preflight.check_capacity(spec, plan, free_disk=10**15, host_memory=host)
    assert [p.key for p in probs] == ["max_concurrent"]
    assert probs[0].message.endswith(
        f"fits with max_concurrent: 1 ({human_bytes(one)}) or batch.micro_batch: 4 "
        f"({human_bytes(2 * small)})")
    # two ranks: ZeRO-1 splits the AdamW moments over them
    from sweeps.plan.memory import with_zero_stage

    z1 = trial_memory_bytes(with_zero_stage(cfg, 1), 0, 2)
    assert z1 < trial_memory_bytes(cfg, 0, 2)
    assert f"optim.zero_stage: 1 ({human_bytes(2 * z1)})" in memory_fixes([cfg], 0, 2, 1, 2 * z1)
    assert not any("zero_stage" in f for f in memory_fixes([cfg], 0, 1, 1, 2 * z1))  # 1 rank
    d = DiskEstimate(checkpoint_bytes=100, params=10, bytes_per_param=10, keep=3, trials=4,
                     concurrent=4, kept_bytes=1200, parent_bytes=0, stable_bytes=0)
    assert preflight.disk_need(d) == 4 * 5 * 100 + 1200
    # keep 2: 4 × 4 × 100 running + 2 × 400 kept; 2 trials at once: 2 × 5 × 100 + 1200
    assert preflight.disk_fixes(d, 2500) == [f"checkpoint.keep: 2 ({human_bytes(2400)})",
                                             f"max_concurrent: 2 ({human_bytes(2200)})"]
    assert preflight.disk_fixes(d, 100) == []


def test_dry_run_prints_the_memory_estimate_it_checks(tmp_path):
    """The per-trial peak-RSS estimate the host check uses is printed, not only in a refusal
    (#39: a sweep's measured peak RSS is set against it)."""
    from sweeps.plan.memory import trial_memory_bytes
    from sweeps.run.console import human_bytes

    spec = _spec(tmp_path, max_concurrent=1)
    plan = build_plan(spec)
    one = trial_memory_bytes(plan.trials[0].config, 0)
    line = preflight.memory_line(spec, plan, host_memory=8 * 2**30)
    assert line == (f"memory (estimate): peak RSS {human_bytes(one)} per CPU trial; "
                    f"{human_bytes(one)} at 1 concurrent (max_concurrent); this machine has "
                    "8.0 GiB")
    assert f"{human_bytes(2 * one)} at 2 concurrent" in preflight.memory_line(spec, plan, 2)

"""Sweep spec validation: every rule, with its message; all before Ray starts."""

import copy
import subprocess
import sys
import time

import pytest
import yaml

from moe_core.errors import SearchSpaceError
from sweeps.plan.build import build_plan
from sweeps.spec.space import eval_expr
from sweeps.spec.sweep import load_spec, parse_spec
from sweeps.spec.trials import iter_grid, trial_config, trial_dict, validation_points

BASE = {
    "model": {"preset": "debug"},
    "moe": {"num_experts": 8, "top_k": 2},
    "data": {"source": "synthetic", "synthetic_vocab": 32, "seq_len": 32},
    "batch": {"global_batch": 8, "micro_batch": 4},
    "optim": {"lr": "1e-3"},
    "schedule": {"kind": "wsd", "warmup_steps": 2},
    "tokens": 4096,
}



def planned(raw):
    """The plan of a spec mapping: building it validates every trial config."""
    return build_plan(parse_spec(raw))

def spec(**over):
    raw = {"sweep": "t", "base": copy.deepcopy(BASE), "search": {}}
    raw.update(over)
    return raw


def test_yaml_string_numbers_are_coerced():
    s = parse_spec(spec())
    assert s.base_config.optim.lr == pytest.approx(1e-3)


@pytest.mark.parametrize(
    "raw, match",
    [
        (spec(bogus=1), r"unknown top-level key 'bogus'"),
        (spec(sweep="a b"), r"sweep='a b' must be a name"),
        (spec(base=None), r"base must be a mapping"),
        (spec(search=[1]), r"search must map dotted config keys"),
        (spec(search={"optim.lr": {"grid": []}}), r"search\.optim\.lr\.grid must be a non-empty"),
        (spec(search={"optim.lr": {"gird": [1]}}), r"search\.optim\.lr\.gird is not known"),
        (spec(search={"optim.lr": {"grid": [1], "choice": [2]}}), r"needs exactly one of"),
        (spec(search={"optim.lr": {"uniform": [1]}}), r"search\.optim\.lr\.uniform must be"),
        (spec(search={"optim.lr": {"uniform": [2, 1]}}), r"low=2 must be < high=1"),
        (spec(search={"optim.lr": {"loguniform": [0, 1]}}), r"loguniform needs low > 0"),
        (spec(search={"moe.top_k": {"int": [1.5, 3]}}), r"int bounds must be integers"),
        (spec(search={"moe.top_k": {"expr": 3}}), r"expr must be a string"),
        (spec(search={"optim.lr": 3}), r"must be a mapping like"),
        (spec(algorithm="bayes"), r"algorithm='bayes' is not known"),
        (spec(scheduler="pbt"), r"scheduler='pbt' is not known"),
        (spec(num_samples=0), r"num_samples=0 must be an integer >= 1"),
        (spec(mode="up"), r"mode='up' must be 'min' or 'max'"),
        (spec(metric="accuracy"), r"metric='accuracy' is not reported"),
        (spec(resources={"ranks": 0}), r"resources\.ranks=0 must be >= 1"),
        (spec(resources={"cpus": 0}), r"resources\.cpus=0 must be > 0"),
        (spec(resources={"gpu": 1}), r"unknown key resources\.gpu"),
        (spec(logging={"wandb": {"mode": "cloud"}}), r"logging\.wandb\.mode='cloud'"),
        (spec(logging={"mlflow": {}}), r"unknown key logging\.mlflow"),
        (spec(failure={"max_failures": -1}), r"failure\.max_failures=-1"),
        (spec(max_concurrent=0), r"max_concurrent=0 must be an integer >= 1"),
        (spec(search={"optim.lr": {"uniform": [1e-4, 1e-2]}}),
         r"search\.optim\.lr uses uniform, but algorithm=grid"),
        (spec(scheduler="asha"), r"scheduler=asha needs several trials"),
    ],
)
def test_spec_rules(raw, match):
    with pytest.raises(SearchSpaceError, match=match):
        parse_spec(raw)


@pytest.mark.parametrize(
    "search, match",
    [
        ({"moe.top_k": {"grid": [2, 16]}}, r"moe\.top_k=16 exceeds moe\.num_experts=8.*"
                                            r"at search point moe\.top_k=16"),
        ({"moe.granularity": {"grid": [1, 3]}}, r"moe\.granularity=3 does not divide"),
        ({"batch.micro_batch": {"grid": [3]}}, r"batch\.micro_batch=3 does not divide"),
        ({"optim.zero_stage": {"grid": [3]}}, r"optim\.zero_stage=3 is not supported with MoE"),
        ({"optim.lr": {"grid": ["fast"]}}, r"optim"),
        ({"optim.lrr": {"grid": [1e-3]}}, r"unknown key optim\.lrr"),
        ({"moe.top_k": {"choice": [1, 9]}}, r"moe\.top_k=9 exceeds"),
    ],
)
def test_impossible_combinations_refused(search, match):
    algo = "random" if any("choice" in v for v in search.values()) else "grid"
    with pytest.raises(SearchSpaceError, match=match):
        planned(spec(search=search, algorithm=algo))


def test_batch_not_divisible_by_ranks_refused():
    raw = spec(resources={"ranks": 3})
    with pytest.raises(SearchSpaceError, match=r"global_batch=8 is not divisible by the 3 ranks"):
        planned(raw)


def test_tau_beyond_run_refused():
    raw = spec(search={"parent.tokens": {"grid": [0]}})
    raw["base"]["parent"] = {"tokens": 100, "moe": {"num_experts": 4, "top_k": 2}}
    raw["base"]["upcycle"] = {"method": "expand_experts"}
    with pytest.raises(SearchSpaceError, match=r"parent\.tokens=0 must be >= 1"):
        planned(raw)


def test_expand_experts_shapes_checked():
    raw = spec()
    raw["base"]["parent"] = {"tokens": 100, "moe": {"num_experts": 2, "top_k": 2}}
    raw["base"]["upcycle"] = {"method": "expand_experts", "factor": 2}
    with pytest.raises(SearchSpaceError, match=r"moe\.num_experts=8 must equal parent"):
        parse_spec(raw)


def test_grid_expansion_seeds_expr_and_when():
    raw = spec(
        search={
            "moe.granularity": {"grid": [1, 2]},
            "moe.num_experts": {"expr": "8 * moe.granularity"},
            "moe.top_k": {"expr": "2 * moe.granularity"},
            "moe.router.logit_norm_lambda": {"grid": [1.0, 2.0], "when": {"moe.granularity": 2}},
        },
        seeds=[0, 1],
    )
    s = parse_spec(raw)
    pts = list(iter_grid(s))
    assert len(pts) == 2 * 2 * 2
    cfgs = [trial_config(s, p) for p in pts]
    g2 = [c for c in cfgs if c.moe.granularity == 2]
    assert all(c.moe.num_experts == 16 and c.moe.top_k == 4 for c in g2)
    assert {c.moe.router.logit_norm_lambda for c in g2} == {1.0, 2.0}
    g1 = [c for c in cfgs if c.moe.granularity == 1]
    assert {c.moe.router.logit_norm_lambda for c in g1} == {None}  # condition not met
    assert {c.seed for c in cfgs} == {0, 1}


def test_eval_expr_safe():
    cfg = {"moe": {"granularity": 4}}
    assert eval_expr("max(1, 2 * moe.granularity) // 2", cfg, "k") == 4
    with pytest.raises(SearchSpaceError, match="only arithmetic"):
        eval_expr("__import__('os')", cfg, "k")
    with pytest.raises(SearchSpaceError, match="refers to moe.top_k, which is not set"):
        eval_expr("moe.top_k + 1", cfg, "k")


def test_validation_points_cover_choice_values_and_bounds():
    s = parse_spec(spec(algorithm="random", search={
        "moe.top_k": {"choice": [1, 2]}, "optim.lr": {"loguniform": [1e-4, 1e-2]}}))
    pts = validation_points(s)
    assert len(pts) == 4
    assert {p["optim.lr"] for p in pts} == {1e-4, 1e-2}


def test_dict_valued_grid(tmp_path):
    s = parse_spec(spec(search={"optim": {"grid": [{"lr": 1e-3}, {"lr": 2e-3}]}}))
    assert [trial_config(s, p).optim.lr for p in iter_grid(s)] == [1e-3, 2e-3]
    assert trial_dict(s, {"optim": {"lr": 5e-4}})["optim"] == {"lr": 5e-4}


def test_shipped_search_spaces_validate_fast():
    import glob

    files = sorted(glob.glob("search_spaces/*.yaml"))
    assert len(files) >= 9
    # it names a checkpoint folder it cannot ship; tests/sweeps/test_hf_sweep.py runs it on one
    with pytest.raises(SearchSpaceError, match="checkpoints/my-llama"):
        build_plan(load_spec("search_spaces/upcycle_pretrained.yaml"))
    build_plan(load_spec(files[0]))  # the imports, once
    for f in (f for f in files if not f.endswith("upcycle_pretrained.yaml")):
        t = time.perf_counter()
        s = load_spec(f)
        build_plan(s)  # builds (and so validates) every trial config, and plans them
        assert time.perf_counter() - t < 5.0, f
        assert s.name == yaml.safe_load(open(f))["sweep"]


def test_cli_error_is_one_line_exit_2(tmp_path):
    bad = tmp_path / "bad.yaml"
    raw = spec(search={"moe.top_k": {"grid": [16]}})
    bad.write_text(yaml.safe_dump(raw))
    t = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "sweeps.run", str(bad), "--dry-run"],
                         capture_output=True, text=True)
    assert time.perf_counter() - t < 20
    assert out.returncode == 2
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert lines[-1].startswith("error: moe.top_k=16 exceeds moe.num_experts=8")
    assert "Traceback" not in out.stderr


def test_set_override_and_unknown_key(tmp_path):
    f = tmp_path / "s.yaml"
    f.write_text(yaml.safe_dump(spec()))
    s = load_spec(str(f), ["base.optim.lr=5e-4", "num_samples=3"])
    assert s.base_config.optim.lr == 5e-4 and s.num_samples == 3
    with pytest.raises(SearchSpaceError, match=r"unknown key optim\.lrx"):
        load_spec(str(f), ["base.optim.lrx=1"])


def test_set_override_of_a_search_knob(tmp_path):
    f = tmp_path / "s.yaml"
    f.write_text(yaml.safe_dump(spec(search={"moe.top_k": {"grid": [1, 2]}})))
    s = load_spec(str(f), ["search.moe.top_k.grid=[1, 2, 4]", "search.optim.lr.grid=[1e-3]"])
    assert [p.values for p in s.search] == [(1, 2, 4), (1e-3,)]


def test_knob_values_are_what_the_trial_ran():
    from sweeps.spec.trials import knob_values

    spec = parse_spec({
        "sweep": "kv",
        "base": {"model": {"preset": "debug"}, "moe": None, "tokens": 4096,
                 "parent": {"tokens": 4096}, "upcycle": {"method": "continue"}},
        "search": {
            "moe": {"grid": [None, {"num_experts": 4, "top_k": 2}]},
            "upcycle.method": {"grid": ["dense_to_moe"], "when": {"moe.num_experts": [4]}},
            "parent.tokens": {"grid": [2048]},
            "tokens": {"expr": "8192 - parent.tokens"},
        },
        "seeds": [3],
    })
    from sweeps.spec.trials import iter_grid

    got = {str(p.get("moe")): knob_values(spec, p) for p in iter_grid(spec)}
    dense = got["None"]
    assert dense["upcycle.method"] == "continue"  # the condition did not hold: base value
    assert dense["tokens"] == 6144 and dense["seed"] == 3  # expr knobs are recorded too
    moe = next(v for k, v in got.items() if k != "None")
    assert moe["upcycle.method"] == "dense_to_moe" and moe["moe"]["num_experts"] == 4


def test_spec_sections_decode_through_from_mapping():
    from moe_core.errors import ConfigError

    s = parse_spec(spec(scheduler={"kind": "asha", "grace_period": "3", "max_t": None},
                        algorithm="random", num_samples=2,
                        resources={"cpus": "2", "gpus": 0.5, "kind": "x"},
                        logging={"wandb": {"project": "123", "mode": "disabled"}}))
    assert s.scheduler == "asha" and s.asha.grace_period == 3 and s.asha.max_t is None
    assert s.resources.cpus == 2 and s.resources.gpus == 0.5
    assert s.wandb.project == "123" and s.wandb.mode == "disabled"
    assert parse_spec(spec(resources=None, logging={"wandb": None})).resources.ranks == 1
    for raw, match in [
        (spec(scheduler={"kind": "asha", "grace": 1}, algorithm="random", num_samples=2),
         r"^unknown key scheduler\.grace; known keys under scheduler: calibration, "
         r"grace_period, max_t, predictor, reduction_factor, rung_metric$"),
        (spec(resources=[1]), r"^resources must be a mapping, got list$"),
        (spec(resources={"ranks": "two"}), r"^resources\.ranks='two' must be an integer$"),
        (spec(logging={"wandb": {"enabled": True, "entity": None, "group": [1]}}),
         r"^logging\.wandb\.group=\[1\] must be a string or null$"),
    ]:
        with pytest.raises(SearchSpaceError, match=match) as e:
            parse_spec(raw)
        assert type(e.value) is SearchSpaceError and isinstance(e.value, ConfigError)


def test_building_the_plan_builds_each_trial_config_once(monkeypatch):
    """A grid of N points: parsing the spec builds no trial config; building the plan builds
    N (its validation), each the very config of its trial; the spec keeps none of them."""
    import dataclasses

    import sweeps.spec.trials as trials
    from sweeps.plan.build import build_plan

    built = []
    real = trials.train_config_from_dict

    def counting(d):
        built.append(real(d))
        return built[-1]

    monkeypatch.setattr(trials, "train_config_from_dict", counting)
    s = parse_spec(spec(search={"moe.top_k": {"grid": [1, 2]},
                                "optim.lr": {"grid": [1e-3, 2e-3, 3e-3]}}))
    assert built == []
    plan = build_plan(s)
    assert len(built) == 6
    # the very configs built (the plan lists them in Tune's order, validation in the spec's)
    assert sorted(id(t.config) for t in plan.trials) == sorted(id(c) for c in built)
    assert all(f.name != "validated" for f in dataclasses.fields(s))
    build_plan(s)
    assert len(built) == 12  # a second plan builds its own

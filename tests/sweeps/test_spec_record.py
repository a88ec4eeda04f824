"""Resume compatibility: the record ``sweeps.run.guard.spec_record`` keeps of a spec (``--resume``
refuses a spec whose record changed) is the same for every existing spec as before the search
space, the ``law:`` block and the spec's sections were re-housed (``sweeps.spec.space``,
``sweeps.law.config``, the typed ``_SpecFile``). The hashes were computed on the code before that
change (commit 77a5da2). ``base`` is left out of the hash: it is ``TrainConfig.to_dict()``, which
changes with the training config's own fields, not with the spec's parsing."""

from __future__ import annotations

import copy
import hashlib
import json

import pytest

from moe_core.train.config import load_yaml
from sweeps.run.guard import spec_record
from sweeps.spec.sweep import load_spec, parse_spec

SHIPPED = {
    "aux_coef.yaml": "00d25145c9c1b7ff",
    "batch_size.yaml": "d23fb0ac62ce9f00",
    "expert_baselines.yaml": "96f0808afa7e5b46",
    "gating_lambda.yaml": "65c905b858ce5200",
    "granularity.yaml": "39cd3485ac722ac6",
    "model_config.yaml": "9c877b9cc8095182",
    "router_order.yaml": "d34183ed3e4bf85f",
    "scaling_d1_d2.yaml": "e8477287a509d45b",
    "scaling_d1_d2_baseline.yaml": "6db8a998dd430453",
    "scaling_d1_d2_law.yaml": "f742511d767788d1",
    "top_k.yaml": "197dc49a5117f1d8",
    "transition_cpt.yaml": "37ff08c2abc1ea67",
    "transition_tau.yaml": "536c2b792b6f9bf9",
    "upcycle_lr.yaml": "f882027ad2d9a24d",
    # its prune rules (each with all its fields, layers included) are recorded since issue 43
    # (before, it recorded as upcycle_lr.yaml did)
    "upcycle_lr_prune.yaml": "7a09d2b409851ea1",
    "cluster/upcycle_lr_8xh100.yaml": "f882027ad2d9a24d",  # upcycle_lr at 8×H100 size
    "upcycle_vs_dense.yaml": "ab600c39146fecae",
}
BASE = {"model": {"preset": "debug"}, "moe": {"num_experts": 8, "top_k": 2},
        "data": {"source": "synthetic", "synthetic_vocab": 32, "seq_len": 32},
        "batch": {"global_batch": 8, "micro_batch": 4}, "optim": {"lr": "1e-3"},
        "schedule": {"kind": "wsd", "warmup_steps": 2}, "tokens": 4096}


def _hash(spec) -> str:
    rec = spec_record(spec)
    rec.pop("base")
    return hashlib.sha256(json.dumps(rec, sort_keys=True).encode()).hexdigest()[:16]


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_shipped_specs_record_as_before(name):
    assert _hash(load_spec(f"search_spaces/{name}")) == SHIPPED[name]


def test_every_distribution_records_as_before():
    spec = parse_spec({
        "sweep": "t", "base": copy.deepcopy(BASE), "algorithm": "random", "num_samples": 2,
        "seeds": [0, 1], "search": {
            "moe.granularity": {"grid": [1, 2]}, "moe.top_k": {"choice": [1, 2]},
            "optim.lr": {"loguniform": [1e-4, "1e-2"]},
            "optim.weight_decay": {"uniform": [0, 0.1]},
            "schedule.warmup_steps": {"int": [1, 3], "when": {"moe.granularity": [1, 2]}},
            "moe.num_experts": {"expr": "8 * moe.granularity"}}})
    assert _hash(spec) == "35d7b3a05720981c"


@pytest.mark.parametrize("law", [
    {"target": {"loss_at": {"D1": 4e4, "D2": 3e5}},  # the old shape, as it was recorded
     "candidates": {"box": {"parent.tokens": [2e4, 3e5], "tokens": [4e4, 6e5]}, "points": 4}},
    {"target": "loss_at", "loss_at": {"D1": 40000, "D2": 300000},  # the flat shape, ints
     "candidates": "box", "box": {"parent.tokens": [20000, 3e5], "tokens": [4e4, 6e5]},
     "points": 4},
])
def test_a_law_block_records_as_before_in_either_shape(law):
    raw = load_yaml("search_spaces/scaling_d1_d2_law.yaml")
    raw["law"] = {"law": "eq8", "fix": {"E": 1e-4}, "ci_width": 0.5, "max_trials": 10,
                  "dstar_range": [1000, 1e17], **law}
    assert _hash(parse_spec(raw)) == "622bb2636feb77f4"
    raw["law"]["widen"] = 1.5  # a key added since: recorded once it leaves its default
    assert spec_record(parse_spec(raw))["law"]["widen"] == 1.5

"""Trial folder names carry readable knob values (not Ray's ``peak=0.0000``), safely."""

from __future__ import annotations

import re

from sweeps.spec.naming import compact, trial_folder_name


def test_small_values_keep_their_digits_and_keys_are_short():
    name = trial_folder_name("ab12_00003", {"optim.lr": 3e-5, "moe.top_k": 2, "seed": 1})
    assert name == "ab12_00003_lr=3e-05_top_k=2_seed=1"


def test_mappings_and_clashing_tails():
    cfg = {"optim.lr": 1e-3, "parent.lr": 5e-3,
           "upcycle.lr_policy": {"policy": "reset", "peak": 0.005}}
    name = trial_folder_name("t1", cfg)
    assert name == "t1_optim.lr=0.001_parent.lr=0.005_lr_policy=policy-reset+peak-0.005"
    assert compact(0.00012345) == "0.000123" and compact(True) == "true"


def test_unsafe_characters_and_the_length_cap_keep_names_unique():
    cfg = {"data.path": "/a b/../c*d", "moe.router.order": "topk_softmax"}
    name = trial_folder_name("t1", cfg)
    assert re.fullmatch(r"[A-Za-z0-9._=+-]+", name) and "/" not in name
    long_a = trial_folder_name("t1", {"x": "a" * 300 + "1"})
    long_b = trial_folder_name("t1", {"x": "a" * 300 + "2"})
    assert len(long_a) <= 120 and len(long_b) <= 120 and long_a != long_b

"""The knob-fidelity audit (issue 38): every key a sweep can vary (the ``base.*`` keys of
docs/reference/spec.md) is read back from a live trainer on every path that builds one, or is
named in ``NOT_READ`` with its reason; a planted override like the old ``aux_coef`` bug fails
the audit naming the key; docs/audit.md's table is this test's own coverage table.

    UPDATE_AUDIT_DOC=1 pytest tests/moe_core/test_audit.py   # rewrite docs/audit.md
"""

from __future__ import annotations

import json
import os
import re
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from moe_core.errors import ConfigError
from moe_core.schedules import Phase
from moe_core.train import Trainer, train_config_from_dict
from moe_core.train import audit as A
from moe_core.train import init as init_mod
from moe_core.train.runner import load_pretrained_parent, parent_phase
from sweeps.cluster.local import free_port
from tests.hf_util import tiny_dense
from tests.ranks import start_ranks

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "audit.md"
VOCAB, SEQ = 32, 32
ELSEWHERE = {"optim.bf16_mode": "a bf16 run; read back in tests/moe_core/test_bf16_modes.py "
                                "(CPU, the dtype forced)"}
"""Keys no CPU path here reads, with the test that reads them back."""
ROUTER = {"order": "topk_softmax", "renormalize": True, "logit_norm_lambda": 1.5,
          "aux_loss": "squared", "aux_coef": 0.1, "z_loss_coef": 1e-3, "adaptive_aux": True,
          "adaptive_xi": 0.3, "adaptive_alpha_max": 0.02, "adaptive_beta": 0.9,
          "loss_free_rate": 0.01, "init_std": 0.03}


def _cfg(cache: Path, **over):
    d = {"name": "audit", "seed": 3, "model": {"preset": "debug", "compile": False,
                                               "fused_head": False, "max_seq_len": 48},
         "data": {"source": "synthetic", "synthetic_vocab": VOCAB, "synthetic_tokens": 20_000,
                  "seq_len": SEQ, "cache_dir": str(cache)},
         "batch": {"global_batch": 8, "micro_batch": 4},
         "optim": {"lr": 2e-3, "betas": [0.8, 0.9], "eps": 1e-7, "weight_decay": 0.05,
                   "grad_clip": 0.5, "dtype": "fp32"},
         "schedule": {"kind": "wsd", "warmup_steps": 1, "decay_frac": 0.5, "min_ratio": 0.2},
         "eval": {"every_steps": 100, "batches": 2, "seed": 5}, "tokens": 4 * 8 * SEQ}
    d.update(over)
    return train_config_from_dict(d)


def _moe(**over):
    return {"num_experts": 4, "top_k": 1, "router": dict(ROUTER), **over}


def _parent_of(cfg):
    """The parent as the sweep trains it (``moe_core.train.runner.train_parent``)."""
    t = Trainer(cfg.parent_run(), phase=parent_phase(cfg))
    t.fit()
    return t.parent_state()


def _data(tmp: Path, c: Path) -> tuple[dict, dict, dict]:
    """Non-synthetic data of three paths: a uint32 token file (split by val_fraction), and a
    text file cut by max_corpus_bytes, tokenized by bytes and by a trained BPE."""
    tmp.mkdir(parents=True, exist_ok=True)
    np.random.default_rng(0).integers(0, 40, 20_000).astype(np.uint32).tofile(tmp / "t.bin")
    (tmp / "corpus.txt").write_text((ROOT / "docs" / "audit.md").read_text() * 8)
    tokens = {"source": "tokens", "path": str(tmp / "t.bin"), "dtype": "uint32",
              "token_vocab_size": 48, "val_fraction": 0.1, "seq_len": SEQ}
    text = {"source": "text", "path": str(tmp / "corpus.txt"), "max_corpus_bytes": 40_000,
            "val_fraction": 0.2, "seq_len": SEQ, "cache_dir": str(c)}
    return tokens, text, {**text, "tokenizer": "bpe", "bpe_vocab_size": 300}


def _paths(tmp: Path) -> dict[str, tuple]:
    """Path name → (config, parent, Trainer keyword arguments), built in order."""
    c = tmp / "cache"
    tokens, text, bpe = _data(tmp / "data", c)
    dense_parent = {"tokens": 2 * 8 * SEQ, "lr": 4e-3}
    up = {"method": "dense_to_moe", "lr_policy": {"policy": "ratio", "ratio": 0.5}}
    coarse = _cfg(c, moe=_moe(capacity_factor=1.5, num_shared_experts=1), data=bpe,
                  parent={**dense_parent, "seed": 7, "batch": {"global_batch": 4,
                                                               "micro_batch": 2}}, upcycle=up)
    granular = _cfg(c, moe=_moe(num_experts=8, granularity=2, top_k=2, interleave=2),
                    parent=dense_parent, upcycle={"method": "dense_to_moe",
                                                  "virtual_groups": False,
                                                  "lr_policy": {"policy": "constant"}})
    tau = _cfg(c, moe=_moe(num_experts=4), upcycle={"method": "expand_experts", "factor": 2,
                                                    "router_noise": 0.05,
                                                    "lr_policy": {"policy": "reset",
                                                                  "peak": 1e-3}},
               parent={"tokens": 2 * 8 * SEQ, "decay": False,
                       "moe": {"num_experts": 2, "top_k": 1}})
    hf = tiny_dense("llama", tmp / "hf")
    pre = _cfg(c, model={"compile": False, "fused_head": False}, moe=_moe(expert_d_ff=16),
               parent={"from_pretrained": str(hf)}, upcycle={"method": "dense_to_moe"})
    out = {"scratch_dense": (_cfg(c, data=tokens), None, {}),
           "scratch_moe": (_cfg(c, moe=_moe(), data=text, optim={"lr": 2e-3, "zero_stage": 1,
                                                      "grad_clip": 0.5, "dtype": "fp32",
                                                      "expert_parallel": 1}),
                           None, {}),
           "dense_to_moe_coarse": (coarse, _parent_of(coarse), {}),
           "dense_to_moe_granular": (granular, _parent_of(granular), {}),
           "expand_experts_tau": (tau, _parent_of(tau), {}),
           "from_pretrained": (pre, load_pretrained_parent(str(hf), tmp / "pc"), {})}
    out.update(_checkpointed(tmp, _cfg(c, moe=_moe())))
    return out


def _checkpointed(tmp: Path, cfg) -> dict[str, tuple]:
    """A WSD branch off a stable run's checkpoint at its decay start, as a trial takes it
    (``sweeps.run.trial``: the full schedule from the checkpoint), and a resume of a run from
    its own checkpoint after one step."""
    start = replace(cfg.schedule, total_steps=cfg.steps).decay_start
    st = Trainer(cfg, phase=Phase.stable(start), out_dir=tmp / "stable",
                 checkpoint_steps=[start]).fit()
    own = Trainer(cfg, out_dir=tmp / "own", checkpoint_steps=[1]).fit(until=1)
    return {"wsd_branch": (cfg, None, {"resume_from": st.checkpoints[start]}),
            "resume": (cfg, None, {"resume_from": own.checkpoints[1]})}


@pytest.fixture(scope="module")
def audited(tmp_path_factory):
    """Path → the audit of a trainer built on it (no training step of its own)."""
    tmp = tmp_path_factory.mktemp("audit")
    out = {}
    for name, (cfg, parent, kw) in _paths(tmp).items():
        out[name] = A.audit(Trainer(cfg, parent=parent, **kw))
    return out


def spec_keys() -> list[str]:
    """Every key a sweep can vary: the ``base.*`` keys of the spec reference (a section row,
    ``(keys: …)``, is not a key; a ``(keys as …)`` row, e.g. ``parent.moe``, is one)."""
    keys = []
    for line in (ROOT / "docs" / "reference" / "spec.md").read_text().splitlines():
        m = re.match(r"\| `base\.([^`]+)` \|", line)
        if m and "(keys: [" not in line:
            keys.append(m.group(1))
    return keys


@pytest.mark.slow
def test_every_path_trains_with_what_it_asked_for(audited):
    for name, table in audited.items():
        assert A.differing(table) == [], (name, {k: table[k] for k in A.differing(table)})


def test_every_spec_key_has_an_audit_case():
    keys = spec_keys()
    assert len(keys) > 60, "the spec reference's base keys were not found"
    missing = [k for k in keys if k not in A.READ and k not in A.NOT_READ]
    assert missing == [], f"spec keys without an audit case: {missing}"
    assert set(A.READ) | set(A.NOT_READ) <= set(keys), "audit keys not in the spec reference"


@pytest.mark.slow
def test_every_read_key_is_read_on_some_path(audited):
    never = [k for k in A.READ if k not in ELSEWHERE and not any(k in t for t in
                                                                 audited.values())]
    assert never == [], f"keys read back on no path: {never}"


def test_a_planted_override_fails_the_audit_naming_the_key(tmp_path, monkeypatch):
    """The old bug: the parent's aux_coef (0.001) copied into the child over its own 0.1."""
    cfg = _cfg(tmp_path / "cache", moe=_moe(), upcycle={"method": "expand_experts"},
               parent={"tokens": 8 * SEQ, "decay": False, "moe": {"num_experts": 2,
                                                                 "top_k": 1}})
    parent = _parent_of(cfg)
    real = init_mod.load_model_state

    def leaky(model, state, resume):
        real(model, state, resume=resume)
        for m in model.moe_layers():
            m.aux_coef.fill_(1e-3)

    monkeypatch.setattr(init_mod, "load_model_state", leaky)
    with pytest.raises(ConfigError, match=r"^knob audit: moe\.router\.aux_coef is 0\.001 ") as e:
        A.check(Trainer(cfg, parent=parent))
    assert "\n" not in str(e.value)


def test_an_hf_parent_overrides_model_max_seq_len_and_the_audit_says_so(tmp_path):
    """Found by this audit: a child of a Hugging Face parent is built from the parent's
    ModelConfig, so its RoPE table keeps the checkpoint's positions (64 here) whatever
    ``model.max_seq_len`` asks; the trial fails in one line instead of ignoring the knob."""
    hf = tiny_dense("llama", tmp_path / "hf")
    cfg = _cfg(tmp_path / "cache", model={"compile": False, "max_seq_len": 48},
               moe=_moe(), parent={"from_pretrained": str(hf)},
               upcycle={"method": "dense_to_moe"})
    t = Trainer(cfg, parent=load_pretrained_parent(str(hf), tmp_path / "pc"))
    with pytest.raises(ConfigError, match=r"^knob audit: model\.max_seq_len is 64 .* asks for 48"):
        A.check(t)


def test_a_planted_operator_override_fails_the_audit(tmp_path, monkeypatch):
    """The operator knobs are measured on the weights at step 0: dense → MoE built without its
    weight scaling (as if the knob were dropped on the way) fails naming the key."""
    hf = tiny_dense("llama", tmp_path / "hf")
    cfg = _cfg(tmp_path / "cache", model={"compile": False, "fused_head": False},
               moe=_moe(expert_d_ff=16), parent={"from_pretrained": str(hf)},
               upcycle={"method": "dense_to_moe"})
    parent = load_pretrained_parent(str(hf), tmp_path / "pc")
    real = init_mod.upcycle.dense_to_moe_state
    monkeypatch.setattr(init_mod.upcycle, "dense_to_moe_state",
                        lambda *a, **k: real(*a, **{**k, "weight_scaling": False}))
    with pytest.raises(ConfigError, match=r"^knob audit: upcycle\.weight_scaling is 1\.0"):
        A.check(Trainer(cfg, parent=parent))


@pytest.mark.parametrize("key, req, eff, ok", [
    ("upcycle.router_noise", 0.0, 0.0, True), ("upcycle.router_noise", 0.05, 0.047, True),
    ("upcycle.router_noise", 0.05, 0.0, False), ("upcycle.router_noise", 0.05, 0.06, False),
    ("upcycle.router_noise", 0.0, 1e-9, False),
    ("upcycle.strategy", "uniform", [[2, 2], [2, 2]], True),
    ("upcycle.strategy", "uniform", [[3, 1], [2, 2]], False),
    ("upcycle.strategy", "grad_norm", [[3, 1], [2, 2]], True),
    ("upcycle.strategy", "grad_norm", [[4, 0], [2, 2]], False),
    ("data.val_fraction", 0.05, 0.0492, True), ("data.val_fraction", 0.2, 0.05, False),
    ("upcycle.weight_scaling", 2.0, 2.01, True), ("upcycle.weight_scaling", 2.0, 1.0, False),
    ("eval.seed", 5, "another draw", False)])
def test_the_audits_own_agreement_rules(key, req, eff, ok):
    assert (A.differing({key: (req, eff)}) == []) is ok


def doc_table(audited: dict[str, dict]) -> str:
    paths = [*audited, "multi_rank_ep"]
    head = "| key | " + " | ".join(f"`{p}`" for p in paths) + " | read back |\n"
    out = [head, "| --- |" + " :-: |" * len(paths) + " --- |\n"]
    for k in spec_keys():
        if k in A.READ:
            cells = ["✓" if k in audited[p] else "" for p in audited]
            cells.append("✓" if k in EP_KEYS else "")
            where = f" ({ELSEWHERE[k]})" if k in ELSEWHERE else ""
            out.append(f"| `{k}` | " + " | ".join(cells) + f" | {A.READ[k].reads}{where} |\n")
        else:
            out.append(f"| `{k}` |" + " |" * len(paths) + f" not read: {A.NOT_READ[k]} |\n")
    return "".join(out)


@pytest.mark.slow
def test_the_docs_table_is_this_tests_coverage(audited):
    table = doc_table(audited)
    text = DOC.read_text()
    start, end = text.index("<!-- audit-table -->\n"), text.index("<!-- /audit-table -->")
    new = text[:start] + "<!-- audit-table -->\n" + table + text[end:]
    if os.environ.get("UPDATE_AUDIT_DOC"):
        DOC.write_text(new)
    assert text == new, "docs/audit.md is stale: UPDATE_AUDIT_DOC=1 pytest " + __file__


# ---- multi-rank: 2 gloo ranks, expert parallelism ------------------------------------------

EP_CFG = dict(moe=_moe(), batch={"global_batch": 8, "micro_batch": 2},
              optim={"lr": 2e-3, "expert_parallel": 2, "dtype": "fp32"})
EP_KEYS = frozenset(k for k, c in A.READ.items() if k not in ELSEWHERE and
                    c.requested(_cfg(Path("/nonexistent"), **EP_CFG), None) is not A.NA)


def _rank(rank: int, world: int, port: int, tmp: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      LOCAL_RANK=str(rank), WORLD_SIZE=str(world))
    t = Trainer(_cfg(Path(tmp) / "cache", **EP_CFG))
    Path(tmp, f"rank{rank}.json").write_text(json.dumps(
        {"table": {k: list(v) for k, v in A.audit(t).items()},
         "local": t.model.moe_layers()[0].num_local_experts}))
    torch.distributed.barrier()


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.skipif(sys.platform != "linux", reason="gloo multiprocess test on Linux")
def test_two_expert_ranks_train_with_what_they_asked_for(tmp_path):
    start_ranks(_rank, args=(2, free_port(), str(tmp_path)), nprocs=2)
    for r in (0, 1):
        got = json.loads((tmp_path / f"rank{r}.json").read_text())
        assert got["local"] == 2  # the experts really are split over the 2 ranks
        table = {k: tuple(v) for k, v in got["table"].items()}
        assert set(table) == EP_KEYS
        assert A.differing(table) == [], {k: table[k] for k in A.differing(table)}
        assert table["optim.expert_parallel"][1] == 2
        assert table["batch.global_batch"][1] == 8 * SEQ  # 2 micro × 2 accum × 2 ranks × seq

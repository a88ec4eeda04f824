"""The knob-fidelity audit (issue 38): every knob a sweep can vary, read back from the live
trainer, model, optimizer and engine of a run at set-up, never from its config, and compared
with the value the config asks for.

``audit(trainer)`` returns ``{key: (requested, effective)}`` for every key that applies to the
run (a dense run has no router); :func:`check` raises one ``ConfigError`` line naming the first
key whose effective value differs. ``READ`` says, per key, what is read back; ``NOT_READ`` names
each remaining spec key with the reason it has no live object to read (tests/moe_core/
test_audit.py fails for a spec key in neither, and writes docs/audit.md's table).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from moe_core.errors import ConfigError
from moe_core.hf_config import model_config as hf_model_config
from moe_core.presets import PRESETS
from moe_core.schedules import Phase, lr_at, run_schedule
from moe_core.train import audit_reads as R
from moe_core.train.engine import DEFAULT_BF16_MODE

NA = object()
"""A key that does not apply to this run (the router of a dense run)."""


@dataclass(frozen=True)
class Check:
    requested: Callable[[Any, Any], Any]
    """(TrainConfig, ParentState or None) → the value the configuration asks for, or NA."""
    effective: Callable[[Any], Any]
    """Trainer → the value read back from its live objects."""
    reads: str
    """What is read back (docs/audit.md)."""
    applies: Callable[[Any], bool] = lambda t: True
    """Trainer → whether the key is read on it (an adapted α^(l) resumed is training state)."""
    agree: Callable[[Any, Any], bool] | None = None
    """(requested, effective) → whether they agree, where equality is not the rule (a share
    rounded to whole blocks, a noise bound); None: equal (floats to a relative 1e-6)."""


def _moe(t: Any) -> list[Any]:
    return t.model.moe_layers()


def _layers(read: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """One value read from every MoE layer; all layers must agree (else the list)."""
    def effective(t: Any) -> Any:
        vals = [read(m) for m in _moe(t)]
        return vals[0] if len(set(map(repr, vals))) == 1 else vals
    return effective


def _router(field: str) -> Check:
    return Check(lambda c, p: NA if c.moe is None else getattr(c.moe.router, field),
                 _layers(lambda m: getattr(m.cfg.router, field)),
                 f"`layer.cfg.router.{field}` of every live MoE layer (what its forward reads)")


def _moe_field(field: str, read: Callable[[Any], Any], reads: str) -> Check:
    return Check(lambda c, p: NA if c.moe is None else getattr(c.moe, field), _layers(read), reads)


def _groups(field: str) -> Callable[[Any], Any]:
    """``field`` of every optimizer param group (for weight decay: the groups of matrices, all
    but ``no_decay``; DeepSpeed's ZeRO groups hold flat partitions, so by name)."""
    def effective(t: Any) -> Any:
        inner = getattr(t.optimizer, "optimizer", t.optimizer)
        vals = {repr(g[field]): g[field] for g in inner.param_groups
                if field != "weight_decay" or g.get("name") != "no_decay"}
        v = list(vals.values())
        return (list(v[0]) if isinstance(v[0], tuple) else v[0]) if len(v) == 1 else v
    return effective


def requested_peak(c: Any, p: Any) -> float:
    """The peak LR the configuration asks for (000 App. A.6: the upcycling LR policies)."""
    pol = c.upcycle.lr_policy if (p is not None and c.upcycle is not None) else None
    if pol is None or pol.policy == "reset":
        return pol.peak if pol is not None and pol.peak is not None else c.optim.lr
    return pol.ratio * p.peak_lr if pol.policy == "ratio" else p.final_lr


def lr_steps(c: Any) -> list[int]:
    """The steps the LR is read at: 0, the end of warmup, the decay start, the last step."""
    s = replace(c.schedule, total_steps=c.steps)
    return sorted({0, min(s.warmup_steps, c.steps - 1), min(s.decay_start, c.steps - 1),
                   c.steps - 1})


def _requested_lrs(c: Any, p: Any) -> list[float]:
    pol = c.upcycle.lr_policy.policy if (p is not None and c.upcycle is not None) else None
    s = replace(c.schedule, total_steps=c.steps)
    if pol == "constant":
        s = replace(s, kind="constant", warmup_steps=0)
    return [lr_at(i, peak=requested_peak(c, p), cfg=s) for i in lr_steps(c)]


def _parent_final_lr(c: Any, p: Any) -> Any:
    if p is None or c.parent is None or c.parent.from_pretrained is not None:
        return NA
    pr = c.parent_run()
    phase = Phase.full() if c.parent.decay else Phase.stable(pr.steps)
    return run_schedule(pr, None, phase).lr(pr.steps - 1)


def _experts_total(m: Any) -> int:
    return m.router.out_features if m.w_gate.shape[0] * m.ep_size == m.router.out_features \
        else -1


def _shared(m: Any) -> int:
    return 0 if m.shared is None else m.shared.w_gate.shape[1] // m.expert_d_ff


def _interleave(t: Any) -> Any:
    idx = [i for i, b in enumerate(t.model.blocks) if b.is_moe]
    if not idx:
        return NA
    return idx[0] + 1 if all((i + 1) % (idx[0] + 1) == 0 for i in idx) and \
        len(idx) == len(t.model.blocks) // (idx[0] + 1) else idx


def _pretrained(c: Any) -> dict[str, Any] | None:
    if c.parent is None or c.parent.from_pretrained is None:
        return None
    return json.loads((Path(c.parent.from_pretrained) / "config.json").read_text())


def _requested_positions(c: Any, p: Any) -> int:
    """model.max_seq_len; unset: data.seq_len, or a Hugging Face parent's positions (its
    max_position_embeddings, as the child is built from the parent's ModelConfig)."""
    hf = _pretrained(c)
    if c.model.max_seq_len is None and hf is not None:
        return hf_model_config(hf).max_seq_len
    return c.model.max_seq_len or c.data.seq_len


def _dims(t: Any) -> list[int]:
    """(d_model, n_layer, vocab rows) of the live model."""
    return [t.model.tok_emb.weight.shape[1], len(t.model.blocks), t.model.tok_emb.weight.shape[0]]


def _requested_dims(c: Any) -> list[int]:
    """(d_model, n_layer[, vocab]) the config asks for: the checkpoint's or the preset's."""
    hf = _pretrained(c)
    if hf is not None:
        return [hf["hidden_size"], hf["num_hidden_layers"], hf["vocab_size"]]
    pr = PRESETS[c.model.preset]
    return [pr.d_model, pr.n_layer]


def _c(path: str) -> Callable[[Any, Any], Any]:
    """The requested value at a dotted config path."""
    def requested(c: Any, p: Any) -> Any:
        v = c
        for part in path.split("."):
            if v is None:
                return NA
            v = getattr(v, part)
        return list(v) if isinstance(v, tuple) else v
    return requested


def _parent_only(read: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    return lambda c, p: NA if p is None or c.parent is None else read(c, p)


def _scratch_only(read: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    return lambda c, p: NA if c.parent is not None and c.parent.from_pretrained else read(c, p)


def _parent_experts(t: Any) -> Any:
    """E of the parent, from the router rows of the parent state handed to the trainer."""
    rows = [v.shape[0] for k, v in t.parent.model_state.items() if k.endswith("router.weight")]
    return rows[0] if rows else None


def _ds(t: Any, read: str) -> Any:
    return getattr(t.engine, read)()


def _ep(c: Any, p: Any) -> Any:
    """0 (all ranks) asks for no number: NA."""
    return NA if c.moe is None or not c.optim.expert_parallel else c.optim.expert_parallel


def _grad_clip(t: Any) -> float:
    return (t.cfg.optim.grad_clip if t.clip_in_loop else 0.0) + _ds(t, "gradient_clipping")


def _tokens_per_step(t: Any) -> int:
    """micro-batch × gradient accumulation × data-parallel ranks × sequence length."""
    return t.batcher.micro_batch * t.gas * t.world * t.batcher.seq_len


def _lrs(t: Any) -> list[float]:
    return [t.plan.lr(i) for i in lr_steps(t.cfg)]


def _source_only(sources: str | tuple[str, ...],
                 read: Callable[[Any], Any]) -> Callable[[Any, Any], Any]:
    """A data key that acts on these sources only (``data.dtype``: token files)."""
    ok = (sources,) if isinstance(sources, str) else sources
    return lambda c, p: read(c) if c.data.source in ok else NA


def _requested_tokenizer(c: Any) -> Any:
    if c.data.tokenizer == "bytes":
        return "bytes"
    return NA if c.data.tokenizer == "bpe" else R.file_digest(c.data.tokenizer_file)


def _val_fraction(c: Any, p: Any) -> Any:
    """Not used by a token directory's train.bin / val.bin."""
    d = c.data
    return NA if d.source == "tokens" and Path(d.path).is_dir() else d.val_fraction


def _granularity(c: Any) -> int:
    return c.model_config().ffn_dim // c.moe.resolved_expert_d_ff(c.model_config().ffn_dim)


def _fresh_method(method: str, read: Callable[[Any], Any]) -> Callable[[Any, Any], Any]:
    """An operator knob of this ``upcycle.method``, read on the weights it made (at step 0)."""
    return _parent_only(lambda c, p: read(c) if c.upcycle.method == method else NA)


READ: dict[str, Check] = {
    "seed": Check(_c("seed"), lambda t: t.batcher.seed, "`trainer.batcher.seed` (data order)"),
    "model.preset": Check(_scratch_only(lambda c, p: _requested_dims(c)),
                          lambda t: _dims(t)[:2],
                          "d_model and layers of the live model (embedding width, blocks)"),
    "model.max_seq_len": Check(_requested_positions,
                               lambda t: t.model.rope_cos.shape[0],
                               "rows of the live model's RoPE table"),
    "model.compile": Check(lambda c, p: NA if c.model.compile == "auto" else c.model.compile,
                           lambda t: t.model.compiled or t.model.compile_error is not None,
                           "whether the live model's blocks are compiled (or ran eager after "
                           "the one warning naming model.compile)"),
    "model.activation_checkpointing": Check(_c("model.activation_checkpointing"),
                                            lambda t: t.model.activation_checkpointing,
                                            "`model.activation_checkpointing` of the live model"),
    "model.chunked_loss": Check(_c("model.chunked_loss"), lambda t: t.model.chunked_loss,
                                "`model.chunked_loss` of the live model"),
    "model.fused_head": Check(lambda c, p: NA if c.model.fused_head == "auto"
                              else c.model.fused_head, lambda t: t.model.fused_head,
                              "`model.fused_head` of the live model"),
    "moe.num_experts": _moe_field("num_experts", _experts_total,
                                  "router rows of every live MoE layer (= local experts × "
                                  "expert ranks)"),
    "moe.top_k": _moe_field("top_k", lambda m: m.cfg.top_k, "`layer.cfg.top_k` (what routing "
                            "reads)"),
    "moe.granularity": Check(lambda c, p: NA if c.moe is None or c.moe.expert_d_ff else
                             c.model_config().ffn_dim // c.moe.granularity,
                             _layers(lambda m: m.w_gate.shape[2]),
                             "d_ff per expert: the width of every live layer's expert weights"),
    "moe.expert_d_ff": Check(lambda c, p: NA if c.moe is None or not c.moe.expert_d_ff else
                             c.moe.expert_d_ff, _layers(lambda m: m.w_gate.shape[2]),
                             "the width of every live layer's expert weights"),
    "moe.num_shared_experts": _moe_field("num_shared_experts", _shared,
                                         "the shared expert's width / expert d_ff"),
    "moe.capacity_factor": _moe_field("capacity_factor", lambda m: m.cfg.capacity_factor,
                                      "`layer.cfg.capacity_factor` (what dispatch reads)"),
    "moe.interleave": Check(lambda c, p: NA if c.moe is None else c.moe.interleave,
                            _interleave, "which live blocks hold an MoE layer"),
    "moe.experts_kernel": _moe_field("experts_kernel", lambda m: m.cfg.experts_kernel,
                                     "`layer.cfg.experts_kernel` (resolved at set-up)"),
    **{f"moe.router.{f}": _router(f) for f in (
        "order", "renormalize", "logit_norm_lambda", "aux_loss", "z_loss_coef",
        "adaptive_aux", "adaptive_xi", "adaptive_alpha_max", "adaptive_beta",
        "loss_free_rate")},
    "moe.router.aux_coef": Check(lambda c, p: NA if c.moe is None else c.moe.router.aux_coef,
                                 _layers(lambda m: round(float(m.aux_coef), 9)),
                                 "the `aux_coef` buffer of every live MoE layer (α^(l), the "
                                 "factor of its aux loss; with adaptive_aux, at a fresh start "
                                 "only: resumed, it is the adapted training state)",
                                 lambda t: t.start == 0 or not t.cfg.moe.router.adaptive_aux),
    "moe.router.init_std": Check(lambda c, p: NA if c.moe is None else c.moe.router.init_std
                                 or math.sqrt(2 / (5 * c.model_config().d_model)),
                                 _layers(lambda m: m.router_init_std),
                                 "`layer.router_init_std` of every live MoE layer"),
    "data.seq_len": Check(_c("data.seq_len"), lambda t: t.batcher.seq_len,
                          "`trainer.batcher.seq_len`"),
    "data.synthetic_vocab": Check(lambda c, p: NA if c.data.source != "synthetic" or
                                  c.parent is not None else c.data.synthetic_vocab,
                                  lambda t: _dims(t)[2], "embedding rows of the live model"),
    "data.source": Check(_c("data.source"), R.source,
                         "the source of the live dataset (its content hash names it)"),
    "data.path": Check(_source_only("tokens", lambda c: R.requested_token_file(c.data.path)),
                       R.token_file, "the file the live training split maps"),
    "data.dtype": Check(_source_only("tokens", lambda c: c.data.dtype),
                        lambda t: t.batcher.tokens.dtype.name,
                        "the dtype of the live training tokens"),
    "data.token_vocab_size": Check(_source_only("tokens", lambda c: NA if c.parent is not None
                                                or not c.data.token_vocab_size
                                                else c.data.token_vocab_size),
                                   lambda t: _dims(t)[2], "embedding rows of the live model"),
    "data.tokenizer": Check(_source_only(("stdlib", "text"), _requested_tokenizer),
                            R.tokenizer, "the live dataset's tokenizer: `bytes` (no tokenizer "
                            "file) or its tokenizer.json's digest (a Hugging Face folder's; "
                            "`bpe`: by its vocabulary, data.bpe_vocab_size)"),
    "data.bpe_vocab_size": Check(_source_only(("stdlib", "text"), lambda c: NA if
                                              c.data.tokenizer != "bpe" else
                                              c.data.bpe_vocab_size),
                                 lambda t: t.vocab_size,
                                 "the vocabulary of the live dataset's trained BPE"),
    "data.val_fraction": Check(_val_fraction, R.val_share,
                               "the share of the live tokens held out (whole 32768-token "
                               "blocks in memory: within half of the request)",
                               agree=R.within_half),
    "data.max_corpus_bytes": Check(_source_only(("stdlib", "text"),
                                                lambda c: c.data.max_corpus_bytes),
                                   lambda t: t.dataset.corpus_bytes,
                                   "bytes of the files the live dataset read (where the bound "
                                   "cut the corpus)", lambda t: t.dataset.corpus_truncated),
    "data.synthetic_tokens": Check(_source_only("synthetic", lambda c: c.data.synthetic_tokens),
                                   R.stream_tokens, "tokens of the live stream (train + val)"),
    "data.synthetic_concentration": Check(
        _source_only("synthetic", lambda c: c.data.synthetic_concentration),
        R.synthetic_concentration, f"drawn: the live stream's first {R.CHAIN_PREFIX} tokens "
        "are the chain of this concentration and data.synthetic_seed"),
    "data.synthetic_seed": Check(_source_only("synthetic", lambda c: c.data.synthetic_seed),
                                 R.synthetic_seed, "drawn: as data.synthetic_concentration"),
    "data.cache_dir": Check(lambda c, p: NA if c.data.source == "tokens" else
                            str(c.data.resolved_cache_dir.resolve()), R.cache_dir,
                            "the folder of the token cache file the live dataset was read from"),
    "optim.lr": Check(lambda c, p: requested_peak(c, p), lambda t: t.plan.peak,
                      "the peak of the live schedule (`trainer.plan.peak`)"),
    "optim.betas": Check(_c("optim.betas"), _groups("betas"),
                         "`betas` of every optimizer param group"),
    "optim.eps": Check(_c("optim.eps"), _groups("eps"), "`eps` of every optimizer param group"),
    "optim.weight_decay": Check(_c("optim.weight_decay"), _groups("weight_decay"),
                                "`weight_decay` of every param group holding matrices"),
    "optim.grad_clip": Check(_c("optim.grad_clip"), _grad_clip,
                             "the threshold the loop clips at (ZeRO 0) plus the DeepSpeed "
                             "engine's `gradient_clipping()` (one of them is 0)"),
    "optim.zero_stage": Check(_c("optim.zero_stage"), lambda t: _ds(t, "zero_optimization_stage"),
                              "the DeepSpeed engine's `zero_optimization_stage()`"),
    "optim.dtype": Check(lambda c, p: NA if c.optim.dtype == "auto" else c.optim.dtype,
                         lambda t: {"torch.float32": "fp32", "torch.bfloat16": "bf16"}.get(
                             str(t.dtype), str(t.dtype)),
                         "the trainer's compute dtype (`trainer.dtype`)"),
    "optim.bf16_mode": Check(lambda c, p: c.optim.bf16_mode if c.optim.bf16_mode != "auto"
                             else DEFAULT_BF16_MODE[min(c.optim.zero_stage, 2)], R.bf16_mode,
                             "the live weights' dtype and the engine's optimizer class (a bf16 "
                             "run only)", lambda t: str(t.dtype) == "torch.bfloat16"),
    "optim.expert_parallel": Check(_ep, _layers(lambda m: m.ep_size),
                                   "`layer.ep_size` of every live MoE layer (0 = all ranks)"),
    "schedule.kind": Check(lambda c, p: _requested_lrs(c, p), lambda t: _lrs(t),
                           "the live schedule's LR at steps 0, warmup end, decay start, last"),
    "schedule.warmup_steps": Check(lambda c, p: _requested_lrs(c, p), lambda t: _lrs(t),
                                   "as schedule.kind"),
    "schedule.decay_frac": Check(lambda c, p: _requested_lrs(c, p), lambda t: _lrs(t),
                                 "as schedule.kind"),
    "schedule.min_ratio": Check(lambda c, p: _requested_lrs(c, p), lambda t: _lrs(t),
                                "as schedule.kind"),
    "schedule.total_steps": Check(lambda c, p: c.steps, lambda t: t.plan.end_step,
                                  "the live schedule's last step (`trainer.plan.end_step`)"),
    "batch.global_batch": Check(lambda c, p: c.tokens_per_step, _tokens_per_step,
                                "tokens per step: micro-batch × accumulation × ranks × seq"),
    "batch.micro_batch": Check(_c("batch.micro_batch"),
                               lambda t: _ds(t, "train_micro_batch_size_per_gpu"),
                               "the DeepSpeed engine's micro-batch"),
    "eval.batches": Check(_c("eval.batches"), lambda t: len(t.val),
                          "the validation batches the trainer holds"),
    "eval.every_steps": Check(_c("eval.every_steps"), lambda t: t.eval_every,
                              "the cadence the live loop evaluates at (`trainer.eval_every`)"),
    "eval.seed": Check(_c("eval.seed"), lambda t: R.val_seed(t, t.cfg.eval.seed),
                       "drawn: the live first validation batch is this seed's draw"),
    "tokens": Check(lambda c, p: c.steps * c.tokens_per_step,
                    lambda t: t.plan.end_step * _tokens_per_step(t),
                    "last step × tokens per step of the live trainer"),
    "parent.tokens": Check(_parent_only(lambda c, p: NA if c.parent.from_pretrained else
                                        c.parent_run().steps * c.parent_run().tokens_per_step),
                           lambda t: t.parent.tokens,
                           "D1 (τ for expand_experts): the tokens of the parent state handed "
                           "to the trainer"),
    "parent.from_pretrained": Check(_parent_only(lambda c, p: NA if _pretrained(c) is None else
                                                 _requested_dims(c)),
                                    _dims, "d_model, layers and vocab of the live model against "
                                    "the checkpoint's config.json"),
    "parent.moe": Check(_parent_only(lambda c, p: NA if c.parent.moe is None else
                                     c.parent.moe.num_experts), _parent_experts,
                        "E of the parent: router rows of the parent state"),
    "parent.lr": Check(_parent_only(lambda c, p: NA if c.parent.from_pretrained else
                                    c.parent_run().optim.lr), lambda t: t.parent.peak_lr,
                       "the parent state's peak LR"),
    "parent.schedule": Check(_parent_final_lr, lambda t: t.parent.final_lr,
                             "the parent state's final LR"),
    "parent.decay": Check(_parent_final_lr, lambda t: t.parent.final_lr,
                          "the parent state's final LR (peak when it stops before its decay)"),
    "parent.batch": Check(_parent_only(lambda c, p: NA if c.parent.from_pretrained else
                                       c.parent_run().tokens_per_step),
                          lambda t: t.parent.tokens_per_step,
                          "tokens per step of the parent's live batcher, recorded in the "
                          "parent state", lambda t: t.parent.tokens_per_step is not None),
    "parent.seed": Check(_parent_only(lambda c, p: NA if c.parent.from_pretrained else
                                      c.parent_run().seed), lambda t: t.parent.seed,
                         "the data-order seed of the parent's live batcher, recorded in the "
                         "parent state", lambda t: t.parent.seed is not None),
    "upcycle.method": Check(_parent_only(lambda c, p: c.upcycle.method != "expand_experts"),
                            lambda t: t.expansion is None,
                            "whether the trainer holds an expansion map (experts replicated)"),
    "upcycle.factor": Check(_parent_only(lambda c, p: NA if c.upcycle.method != "expand_experts"
                                         else c.upcycle.factor),
                            lambda t: _experts_total(_moe(t)[0]) // _parent_experts(t),
                            "live experts / the parent state's experts"),
    "upcycle.virtual_groups": Check(_fresh_method("dense_to_moe", lambda c: NA if
                                                  _granularity(c) == 1 else
                                                  c.upcycle.virtual_groups),
                                    R.virtual_groups, "whether the G experts of each group "
                                    "share one live router row (step 0; G > 1)",
                                    lambda t: t.fresh),
    "upcycle.weight_scaling": Check(_fresh_method("dense_to_moe", lambda c: R.requested_scale(
                                        c, _granularity(c))), R.expert_scale,
                                    "measured at step 0: (‖w_up of a live expert‖ / ‖its "
                                    "dense shard's‖)², the factor on its output (within 1 %)",
                                    lambda t: t.fresh, R.close_1pct),
    "upcycle.strategy": Check(_fresh_method("expand_experts", lambda c: c.upcycle.strategy),
                              R.replica_counts, "r_e per layer of the trainer's expansion map "
                              "(uniform: all equal; scored: a valid allocation)",
                              lambda t: t.fresh, R.strategy_agrees),
    "upcycle.router_noise": Check(_fresh_method("expand_experts",
                                                lambda c: c.upcycle.router_noise),
                                  R.router_noise, "measured at step 0: the largest |replica's "
                                  "live router bias − its source's|, in (0, δ] (0 for δ = 0)",
                                  lambda t: t.fresh, R.noise_agrees),
    "upcycle.lr_policy.policy": Check(_parent_only(_requested_lrs), lambda t: _lrs(t),
                                      "the live schedule's LR at the chosen steps"),
    "upcycle.lr_policy.peak": Check(_parent_only(requested_peak), lambda t: t.plan.peak,
                                    "the peak of the live schedule"),
    "upcycle.lr_policy.ratio": Check(_parent_only(requested_peak), lambda t: t.plan.peak,
                                     "the peak of the live schedule"),
}

NOT_READ: dict[str, str] = {
    "name": "a label (logs, folder names); trains nothing",
}


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, float) or isinstance(b, float):
        return isinstance(b, (int, float)) and math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-12)
    return a == b


def audit(trainer: Any) -> dict[str, tuple[Any, Any]]:
    """``{key: (requested, effective)}`` for every key of :data:`READ` that applies to the
    run, each effective value read back from ``trainer``'s live objects."""
    c, p = trainer.cfg, trainer.parent
    out = {}
    for key, chk in READ.items():
        req = chk.requested(c, p)
        if req is NA or not chk.applies(trainer):
            continue
        out[key] = (req, chk.effective(trainer))
    return out


def differing(table: dict[str, tuple[Any, Any]]) -> list[str]:
    return [k for k, (req, eff) in table.items()
            if not (READ[k].agree or _same)(req, eff)]


def check(trainer: Any) -> dict[str, Any]:
    """The audit at set-up: ``{"effective.<key>": value}`` for the trial's row, or one
    ``ConfigError`` line naming the first key whose effective value is not the requested one."""
    table = audit(trainer)
    bad = differing(table)
    if bad:
        req, eff = table[bad[0]]
        raise ConfigError(f"knob audit: {bad[0]} is {eff!r} in the live run but the config asks "
                          f"for {req!r} ({len(bad)} key(s) differ: {', '.join(bad)})")
    return {f"effective.{k}": eff for k, (_, eff) in table.items()}

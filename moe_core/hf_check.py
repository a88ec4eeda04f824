"""Check a Hugging Face folder before anything uses it, in bounded time and memory.

- ``config.json`` is capped at :data:`MAX_CONFIG_BYTES` before it is parsed, and its sizes
  (layers, widths, vocabulary, experts) at :data:`SIZE_LIMITS` (:func:`check_sizes`): a
  ``num_hidden_layers: 1e9`` is refused in one line instead of hanging a plan.
- :func:`check_files` (``moe_core.hf_config.check_checkpoint`` on a folder) streams the
  safetensors files: each header's length is checked against the file before it is read (a
  header bomb, a truncated or garbage file), every tensor's dtype, shape and byte range are
  checked against the header and ``config.json`` (wrong shapes, integer embeddings), and each
  tensor is read once and checked finite (NaN weights); memory is bounded by the largest
  tensor.
"""

from __future__ import annotations

import math
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from moe_core.errors import ConfigError, shown
from moe_core.fsio import loads_json, read_bounded

MAX_CONFIG_BYTES = 1 << 20
"""config.json larger than this (1 MiB; real ones are a few KiB) is refused unread."""
MAX_HEADER_BYTES = 100 << 20
"""A safetensors header larger than this (100 MiB, the safetensors library's own cap)."""
SIZE_LIMITS = {"num_hidden_layers": 1024, "hidden_size": 1 << 17, "intermediate_size": 1 << 20,
               "moe_intermediate_size": 1 << 20, "shared_expert_intermediate_size": 1 << 22,
               "vocab_size": 1 << 23, "num_attention_heads": 4096,
               "num_key_value_heads": 4096, "head_dim": 1 << 14,
               "max_position_embeddings": 1 << 24, "num_local_experts": 1 << 14,
               "num_experts": 1 << 14, "num_experts_per_tok": 1 << 14,
               "decoder_sparse_step": 1024, "sliding_window": 1 << 24}
"""Largest accepted value of each config.json size (far above any released model)."""
ZERO_OK = ("shared_expert_intermediate_size", "decoder_sparse_step", "sliding_window")
"""Sizes where 0 means "none"."""
DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1,
               "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}
FLOAT_DTYPES = ("F64", "F32", "F16", "BF16")


def read_config_bounded(f: Path) -> dict[str, Any]:
    """config.json, refused in one line when larger than :data:`MAX_CONFIG_BYTES` (checked
    before reading) or not a JSON object."""
    try:
        size = f.stat().st_size
    except OSError:
        size = 0  # read_bounded says why in one line
    if size > MAX_CONFIG_BYTES:
        raise ConfigError(f"{f} is {size:,} bytes, more than {MAX_CONFIG_BYTES:,}; a "
                          "config.json is a few KiB: give the right folder")
    try:  # a regular file (a named pipe never hangs), size capped before it is read
        raw = read_bounded(f, MAX_CONFIG_BYTES, "config.json", "a JSON file")
    except ConfigError as e:
        raise ConfigError(f"{e}; a config.json is a few KiB: give the right folder") from None
    try:
        cfg = loads_json(raw, str(f))
    except ConfigError as e:
        raise ConfigError(f"{f} is not readable JSON ({e})") from None
    if not isinstance(cfg, dict):
        raise ConfigError(f"{f} must hold a JSON object")
    return cfg


def check_sizes(hf: dict[str, Any], where: str = "config.json") -> None:
    """Every size in :data:`SIZE_LIMITS` present in ``hf`` is an integer in [1, its cap]."""
    for k, cap in SIZE_LIMITS.items():
        v = hf.get(k)
        if v is None:
            continue
        ok = not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v) \
            and v == int(v) and (1 if k not in ZERO_OK else 0) <= v <= cap
        if not ok:
            lo = 0 if k in ZERO_OK else 1
            raise ConfigError(f"{where}: {k}={shown(v)} must be an integer in [{lo}, {cap:,}]; "
                              "fix config.json")


@dataclass
class CheckReport:
    path: str
    files: int
    tensors: int
    elements: int

    def summary(self) -> str:
        return (f"checkpoint {self.path}: {self.files} file(s), {self.tensors} tensors, "
                f"{self.elements:,} weights, all finite")


def _dims(hf: dict[str, Any]) -> dict[str, int]:
    D, H = int(hf["hidden_size"]), int(hf["num_attention_heads"])
    Dh = int(hf.get("head_dim") or D // H)
    F = int(hf.get("intermediate_size") or 0)
    E = hf.get("num_local_experts") or hf.get("num_experts") or 0
    return {"V": int(hf["vocab_size"]), "D": D, "H": H, "Dh": Dh,
            "Hkv": int(hf.get("num_key_value_heads") or H), "F": F,
            "f": int(hf.get("moe_intermediate_size") or F), "E": int(E),
            "L": int(hf["num_hidden_layers"])}


_LAYER = re.compile(r"model\.layers\.(\d+)\.(.+)")


def expected_shape(name: str, d: dict[str, int]) -> tuple[int, ...] | None:
    """The shape ``config.json`` implies for an HF tensor name (None: a name not checked)."""
    V, D, H, Dh, Hkv, F, f = d["V"], d["D"], d["H"], d["Dh"], d["Hkv"], d["F"], d["f"]
    top = {"model.embed_tokens.weight": (V, D), "lm_head.weight": (V, D),
           "model.norm.weight": (D,)}
    if name in top:
        return top[name]
    m = _LAYER.fullmatch(name)
    if m is None:
        return None
    rest = m.group(2)
    table = {"input_layernorm.weight": (D,), "post_attention_layernorm.weight": (D,),
             "self_attn.q_proj.weight": (H * Dh, D), "self_attn.k_proj.weight": (Hkv * Dh, D),
             "self_attn.v_proj.weight": (Hkv * Dh, D), "self_attn.o_proj.weight": (D, H * Dh),
             "self_attn.q_proj.bias": (H * Dh,), "self_attn.k_proj.bias": (Hkv * Dh,),
             "self_attn.v_proj.bias": (Hkv * Dh,), "self_attn.q_norm.weight": (Dh,),
             "self_attn.k_norm.weight": (Dh,),
             "self_attn.qkv_proj.weight": ((H + 2 * Hkv) * Dh, D),
             "mlp.gate_up_proj.weight": (2 * F, D), "mlp.gate_proj.weight": (F, D),
             "mlp.up_proj.weight": (F, D), "mlp.down_proj.weight": (D, F),
             "block_sparse_moe.gate.weight": (d["E"], D), "mlp.gate.weight": (d["E"], D)}
    if rest in table:
        return table[rest]
    e = re.fullmatch(r"(?:block_sparse_moe|mlp)\.experts\.\d+\.(\w+)\.weight", rest)
    if e is not None:
        return {"w1": (f, D), "w3": (f, D), "gate_proj": (f, D), "up_proj": (f, D),
                "w2": (D, f), "down_proj": (D, f)}.get(e.group(1))
    return None


def read_header(f: Path) -> tuple[dict[str, Any], int]:
    """(header, data start) of a safetensors file; its length is checked against the file
    before it is read."""
    size = f.stat().st_size
    with open(f, "rb") as fh:
        head = fh.read(8)
        if len(head) < 8:
            raise ConfigError(f"{f} is {size} bytes: not a safetensors file (truncated?)")
        (n,) = struct.unpack("<Q", head)
        if n > MAX_HEADER_BYTES or n > size - 8:
            raise ConfigError(f"{f}: its header claims {n:,} bytes but the file holds "
                              f"{size - 8:,} after the length (cap {MAX_HEADER_BYTES:,}): a "
                              "truncated or corrupt safetensors file")
        try:
            header = loads_json(fh.read(n), f"{f}: the safetensors header")
        except ConfigError as e:
            raise ConfigError(f"{e}; the file is corrupt") from None
    if not isinstance(header, dict):
        raise ConfigError(f"{f}: the safetensors header is not a JSON object")
    return header, 8 + n


def check_header(f: str | Path) -> int:
    """A safetensors file's header, streamed and checked before any loader maps it: its length
    against the file (a header bomb, a truncated, empty or garbage file) and every entry's
    dtype and byte range (no shapes: for files without a config.json). Returns the tensors."""
    f = Path(f)
    if not f.is_file():
        raise ConfigError(f"{f} is missing or not a regular file")
    header, start = read_header(f)
    data_len = f.stat().st_size - start
    entries = [(k, v) for k, v in header.items() if k != "__metadata__"]
    for name, info in entries:
        _check_entry(f, name, info, data_len, {})
    return len(entries)


def _check_entry(f: Path, name: str, info: Any, data_len: int, dims: dict[str, int]) -> int:
    if not isinstance(info, dict) or not isinstance(info.get("shape"), list) or \
            not isinstance(info.get("data_offsets"), list) or len(info["data_offsets"]) != 2:
        raise ConfigError(f"{f}: tensor {name!r} has a malformed header entry")
    dt, shape, (b, e) = info.get("dtype"), info["shape"], info["data_offsets"]
    if dt not in DTYPE_BYTES:
        raise ConfigError(f"{f}: tensor {name!r} has unknown dtype {shown(dt)}")
    if not all(isinstance(x, int) and x >= 0 for x in (*shape, b, e)):
        raise ConfigError(f"{f}: tensor {name!r} has a bad shape or offsets")
    n = math.prod(shape)
    if e - b != n * DTYPE_BYTES[dt] or e > data_len or b > e:
        raise ConfigError(f"{f}: tensor {name!r} ({dt} {shape}) needs bytes {b}..{e} but the "
                          f"file holds {data_len:,}: truncated or corrupt")
    if name.endswith((".weight", ".bias")) and dt not in FLOAT_DTYPES:
        raise ConfigError(f"{f}: tensor {name!r} is {dt}; weights must be floating point "
                          f"({', '.join(FLOAT_DTYPES)})")
    if not dims:  # a training checkpoint: no config.json to check shapes against
        return n
    want = expected_shape(name, dims)
    if want is not None and tuple(shape) != want:
        raise ConfigError(f"{f}: tensor {name!r} has shape {tuple(shape)} but config.json "
                          f"implies {want}; the weight files do not match config.json")
    m = _LAYER.fullmatch(name)
    if m is not None and int(m.group(1)) >= dims["L"]:
        raise ConfigError(f"{f}: tensor {name!r} is beyond config.json's "
                          f"num_hidden_layers={dims['L']}")
    return n


def check_tensor(f: Path, name: str, t: Any) -> None:
    """A loaded tensor: weights floating point and finite (one line naming it otherwise)."""
    import torch

    if name.endswith((".weight", ".bias")) and not t.is_floating_point():
        raise ConfigError(f"{f}: tensor {name!r} is {t.dtype}; weights must be floating point")
    if t.is_floating_point() and not bool(torch.isfinite(t).all()):
        bad = int((~torch.isfinite(t)).sum())
        raise ConfigError(f"{f}: tensor {name!r} holds {bad:,} non-finite values (NaN/inf); "
                          "the checkpoint is damaged")


def check_files(files: list[Path], hf: dict[str, Any], finite: bool = True) -> CheckReport:
    """Stream the safetensors ``files`` of a folder whose config.json is ``hf``: headers,
    dtypes, shapes and byte ranges first, then (``finite``) each tensor read once."""
    from safetensors import safe_open

    check_sizes(hf)
    try:
        dims = _dims(hf)
    except (KeyError, TypeError, ValueError) as e:
        raise ConfigError(f"config.json lacks or mistypes a size ({e}); fix config.json") \
            from None
    tensors = elements = 0
    for f in files:
        header, start = read_header(f)
        data_len = f.stat().st_size - start
        for name, info in header.items():
            if name == "__metadata__":
                continue
            elements += _check_entry(f, name, info, data_len, dims)
            tensors += 1
        if finite:
            with safe_open(str(f), framework="pt") as fh:
                for k in fh.keys():  # noqa: SIM118 (safe_open has no __iter__)
                    check_tensor(f, k, fh.get_tensor(k))
    return CheckReport(str(files[0].parent) if files else "", len(files), tensors, elements)

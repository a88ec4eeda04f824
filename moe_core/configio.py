"""The one decoder of nested mappings (parsed YAML, ``dataclasses.asdict`` output) into the
project's frozen config dataclasses: ``decode``, a ``pydantic.TypeAdapter`` over them, plus what
pydantic does not do: YAML 1.1's numeric strings read as numbers, stricter scalars, numbers kept
as written, and each refusal as one line naming the dotted key and what it takes. The files
themselves are read by ``moe_core.yamlio``. Torch-free: a spec is refused before any training
stack is imported.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import numbers
import types
import typing
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import ConfigDict, TypeAdapter, ValidationError

from moe_core.errors import ConfigError, shown

INT_MAX = 2**63 - 1
"""Largest magnitude an integer field takes (int64: what torch and numpy hold)."""
_PYDANTIC = ConfigDict(extra="forbid", allow_inf_nan=False, coerce_numbers_to_str=True,
                       revalidate_instances="never")
"""Unknown keys refused, NaN/inf refused, a number where a string goes taken as its text."""
_STRUCTURAL = {"unexpected_keyword_argument": 0, "extra_forbidden": 0, "missing": 1,
               "missing_keyword_argument": 1, "dataclass_type": 2, "dataclass_args_type": 2}
_NUMBER_ERRORS = {"int_parsing", "float_parsing", "literal_error"}
"""Errors of a YAML 1.1 number written as a string (``1e6`` where an int goes), read again."""


def coerce_number(value: Any, key: str = "") -> Any:
    """YAML 1.1 reads ``1e-4`` (no dot) as a string: turn numeric strings into numbers.

    An int when the string has no dot or exponent and is integral, a float otherwise; any other
    value is returned unchanged. ``key`` is unused (kept for callers that pass it).
    """
    if isinstance(value, str):
        try:
            f = float(value)
        except ValueError:
            return value
        return int(f) if f.is_integer() and "e" not in value.lower() and "." not in value else f
    return value


def _join(prefix: str, key: Any) -> str:
    return f"{prefix}.{key}" if prefix else str(key)


def _arms(tp: Any) -> tuple[Any, ...]:
    """The alternatives of a union type (``X | None``), or ``(tp,)``."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return typing.get_args(tp)
    return (tp,)


def _dataclass_arm(tp: Any) -> type | None:
    return next((a for a in _arms(tp) if isinstance(a, type) and dataclasses.is_dataclass(a)),
                None)


@functools.cache
def _fields(cls: type) -> dict[str, Any]:
    """``{name: resolved type}`` of the init fields of dataclass ``cls``."""
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls) if f.init}


@functools.cache
def _adapter(tp: Any) -> TypeAdapter:
    # a one-tuple around ``tp``: pydantic takes a config for the tuple, and nested stdlib
    # dataclasses (which carry none of their own) inherit it
    return TypeAdapter(tuple[tp], config=_PYDANTIC)


def _walk(tp: Any, loc: tuple[Any, ...], prefix: str) -> tuple[Any, str, tuple[Any, ...], Any]:
    """Follow a pydantic error location from ``tp``: (the type there, its dotted path, the
    location with pydantic's union-arm tags removed, the dataclass holding the last key)."""
    path, keys, owner = prefix, [], None
    for part in loc:
        dc = _dataclass_arm(tp)
        if isinstance(part, int):
            arm = next((a for a in _arms(tp) if typing.get_origin(a) is tuple), None)
            args = typing.get_args(arm) if arm is not None else ()
            tp = args[0] if len(args) == 2 and args[1] is Ellipsis else \
                args[min(part, len(args) - 1)] if args else Any
            path, keys = f"{path}[{part}]", [*keys, part]
        elif dc is not None and (part in _fields(dc) or all(
                a in (dc, type(None)) for a in _arms(tp))):
            owner, tp = dc, _fields(dc).get(part, Any)
            path, keys = _join(path, part), [*keys, part]
        # else: a union arm's tag (``bool``, ``literal['auto']``): not a key
    return tp, path, tuple(keys), owner


def _describe(tp: Any) -> str:
    names = []
    for arm in _arms(tp):
        origin = typing.get_origin(arm)
        if arm is type(None):
            names.append("null")
        elif origin is Literal:
            names.append("one of " + ", ".join(repr(a) for a in typing.get_args(arm)))
        elif origin is tuple:
            args = typing.get_args(arm)
            fixed = args and not (len(args) == 2 and args[1] is Ellipsis)
            names.append(f"a list of {len(args)} values" if fixed
                         else f"a list ({_describe(args[0])} each)" if args else "a list")
        elif isinstance(arm, type) and dataclasses.is_dataclass(arm):
            names.append("a mapping")
        else:
            names.append(
                {int: "an integer", float: "a number", str: "a string", bool: "true or false"}
                .get(arm, getattr(arm, "__name__", str(arm)))
            )
    return " or ".join(names)


def _get(data: Any, keys: tuple[Any, ...]) -> Any:
    for k in keys:
        data = data[k]
    return data


def _thaw(value: Any) -> Any:
    """A copy of parsed YAML / ``asdict`` output that a numeric string can be replaced in."""
    if isinstance(value, Mapping):
        return {k: _thaw(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_thaw(v) for v in value]
    return value


def _message(tp: Any, err: dict[str, Any], prefix: str, data: Any) -> str | ConfigError:
    """One pydantic error as the project's one-line message naming the dotted key, or the
    dataclass's own ``ConfigError`` (its class kept: ``SearchSpaceError``). As the
    hand-written decoder did: structural problems first, then NaN/inf, then the dataclass's own
    rule (``__post_init__``) on the values as written, then the type the key takes."""
    kind, ctx = err["type"], err.get("ctx") or {}
    at, path, keys, owner = _walk(tp, err["loc"][1:], prefix)
    value = err["input"]
    if kind in ("unexpected_keyword_argument", "extra_forbidden"):
        parent = path.rpartition(".")[0] if "." in path else ""
        under = f"under {parent}" if parent else "at the top level"
        name = str(keys[-1]) if len(str(keys[-1])) <= 100 else shown(keys[-1], 100)
        return (f"unknown key {_join(parent, name)}; known keys {under}: "
                f"{', '.join(sorted(_fields(owner)))}")
    if kind in ("missing", "missing_keyword_argument") and keys and isinstance(keys[-1], int):
        keys = keys[:-1]  # a fixed-length tuple given too few values: about the tuple
        at, path = _walk(tp, keys, prefix)[:2]
        kind, value = "too_short", _get(data, keys)
    if kind in ("missing", "missing_keyword_argument"):
        return f"missing required key {path}"
    if kind in ("dataclass_type", "dataclass_args_type"):
        return f"{path or 'the config'} must be a mapping, got {type(value).__name__}"
    if kind == "finite_number" or (isinstance(value, float) and not math.isfinite(value)):
        return f"{path}={shown(value)} is not finite; use {_describe(at)}"
    # the dataclass whose field this is: its own rule, on the values as written, speaks first
    field_at = max((i for i, k in enumerate(keys) if isinstance(k, str)), default=None)
    if isinstance(ctx.get("error"), ConfigError):  # raised by a __post_init__ at ``path``
        field_at = len(keys)
    if field_at is not None:
        holder, where = _walk(tp, keys[:field_at], prefix)[:2]
        if (cls := _dataclass_arm(holder)) is not None and \
                (own := _own_error(cls, _get(data, keys[:field_at]), where)) is not None:
            return own
    if isinstance(ctx.get("error"), ValueError):
        return ctx["error"] if isinstance(ctx["error"], ConfigError) else \
            f"{path or 'the config'}: {ctx['error']}"
    if kind == "int_parsing_size":
        return f"{path}={shown(value)} {_OUT_OF_RANGE}; use {_describe(at)}"
    shown_value = list(value) if isinstance(value, tuple) else value
    return f"{path}={shown(shown_value)} must be {_describe(at)}"


_OUT_OF_RANGE = f"is out of range: an integer is at most 2**63 - 1 = {INT_MAX:,} in magnitude"


def _admits_number(tp: Any) -> bool:
    return any(a in (int, float) or (typing.get_origin(a) is Literal and any(
        isinstance(x, (int, float)) and not isinstance(x, bool) for x in typing.get_args(a)))
        for a in _arms(tp))


def _misfit(tp: Any, data: Any, path: str) -> str | None:
    """What pydantic's lax mode would take that the project refuses, walking the input beside
    the types before any dataclass sees it: a bool where a number goes (``true`` is not 1),
    anything but true/false where only they go (pydantic takes ``1`` and ``'on'``), bytes where
    text goes, an integer beyond int64."""
    dc = _dataclass_arm(tp)
    if isinstance(data, Mapping) and dc is not None:
        fields = _fields(dc)
        return next((p for k, v in data.items() if k in fields and (p := _misfit(
            fields[k], v, _join(path, k))) is not None), None)
    if isinstance(data, (list, tuple)):
        return next((p for i, v in enumerate(data) if (p := _misfit(
            _walk(tp, (i,), "")[0], v, f"{path}[{i}]")) is not None), None)
    arms = _arms(tp)
    if isinstance(data, bool) and _admits_number(tp) and bool not in arms:
        return f"{path}={shown(data)} is true/false, not a number; use {_describe(tp)}"
    if isinstance(data, (bytes, bytearray)) and str in arms:  # YAML !!binary: no text
        return f"{path}={shown(data)} must be {_describe(tp)}"
    if bool in arms and not isinstance(data, bool) and data is not None and not any(
            a in (str, int, float) or (typing.get_origin(a) is Literal and data in
                                       typing.get_args(a)) for a in arms):
        return f"{path}={shown(data)} must be {_describe(tp)}"  # not pydantic's 'on' or 1
    if isinstance(data, numbers.Real) and not isinstance(data, bool) and int in arms and \
            math.isfinite(data) and abs(data) > INT_MAX:
        return f"{path}={shown(data)} {_OUT_OF_RANGE}; use {_describe(tp)}"
    return None


def _as_written(data: Any, out: Any) -> Any:
    """``out`` with each scalar the type YAML gave it where the field took it unchanged in value
    (``2`` stays an int in a float field, ``1e6`` a float in an int field, ``123`` a number in a
    string field), as the project's configs always held them: their JSON, and so the parent
    cache keys hashed from it, do not change."""
    if isinstance(data, Mapping) and dataclasses.is_dataclass(out) and not isinstance(out, type):
        for k, v in data.items():
            if k not in _fields(type(out)):
                continue  # a field a validator decoded as a whole (``prune``)
            old = getattr(out, k)
            new = _as_written(v, old)
            if new is not old:
                object.__setattr__(out, k, new)  # frozen: set once, right after decoding
        return out
    if isinstance(data, list) and isinstance(out, tuple) and len(data) == len(out):
        items = tuple(_as_written(d, o) for d, o in zip(data, out))
        return items if any(a is not b for a, b in zip(items, out)) else out
    if isinstance(data, (int, float)) and not isinstance(data, bool) and \
            not isinstance(out, bool) and type(data) is not type(out) and \
            (data == out if isinstance(out, (int, float)) else str(data) == out):
        return data
    return out


def _own_error(owner: type, raw: Any, path: str) -> ConfigError | None:
    """The error of ``owner``'s own rule (``__post_init__``) for ``raw`` as written (``cpus=0``,
    not pydantic's ``cpus=0.0``), its nested sections decoded; None if it raises none."""
    if not isinstance(raw, Mapping):
        return None
    kwargs = {}
    for k, v in raw.items():
        ftp = _fields(owner).get(k, Any)
        kwargs[k] = decode(ftp, v, _join(path, k)) if isinstance(v, Mapping) else \
            tuple(v) if isinstance(v, list) else v
    try:
        owner(**kwargs)
    except ConfigError as e:
        return e
    except Exception:  # noqa: BLE001 (a rule tripping over a value: pydantic's message stands)
        return None
    return None


def decode(tp: Any, data: Any, prefix: str = "", error: type[ConfigError] = ConfigError) -> Any:
    """Decode ``data`` (parsed YAML, ``dataclasses.asdict`` output) as type ``tp`` with pydantic:
    nested dataclasses from mappings (an instance passes through), lists into tuples, ``T |
    None`` keeps None, YAML 1.1's numeric strings (``1e-4``) into numbers where a number goes.
    Every refusal is one ``error`` (a ``ConfigError`` class) naming the full dotted key
    (``prefix`` is the path of ``data``) and what the key takes: an unknown key (with the known
    ones), a missing required key, a non-mapping where a mapping goes, a value of the wrong
    type, a bool where a number goes (``true`` is not 1), NaN or ±inf, an integer beyond int64;
    a dataclass's own rules (``__post_init__``) keep their messages."""
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        if isinstance(data, tp):
            return data
        if not isinstance(data, Mapping):
            raise error(f"{prefix or 'the config'} must be a mapping, got {type(data).__name__}")
    data = _thaw(data)
    problem = _misfit(tp, data, prefix)
    if problem is not None:
        raise error(problem)
    while True:
        try:
            out = _adapter(tp).validate_python((data,))[0]
            break
        except ValidationError as e:
            errors = e.errors(include_url=False)
        for err in errors:  # a YAML 1.1 number written as a string: read it, try again
            keys = _walk(tp, err["loc"][1:], "")[2]
            v = err["input"]
            if err["type"] in _NUMBER_ERRORS and isinstance(v, str) and keys and \
                    coerce_number(v) is not v and _admits_number(_walk(tp, err["loc"][1:], "")[0]):
                _get(data, keys[:-1])[keys[-1]] = coerce_number(v)
                break
        else:
            first = min(errors, key=lambda x: (_STRUCTURAL.get(x["type"], 3) > 2,
                                               len(x["loc"]), _STRUCTURAL.get(x["type"], 3)))
            problem = _message(tp, first, prefix, data)
            raise (problem if isinstance(problem, error) else error(str(problem))) from None
    return _as_written(data, out)


def unknown_key(cls: type, dotted: str) -> str | None:
    """None if ``dotted`` (``moe.router.order``) names a field of dataclass ``cls`` (following
    nested and optional dataclass fields), else ``decode``'s message for that key."""
    tp: Any = cls
    path = ""
    for part in dotted.split("."):
        dc = _dataclass_arm(tp)
        if dc is None:
            return f"unknown key {dotted}: {path} is not a mapping of options"
        if part not in _fields(dc):
            under = f"under {path}" if path else "at the top level"
            return (f"unknown key {_join(path, part)}; known keys {under}: "
                    f"{', '.join(sorted(_fields(dc)))}")
        tp, path = _fields(dc)[part], _join(path, part)
    return None

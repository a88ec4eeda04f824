"""The reader of every config and spec file: a bounded, strict YAML reader (``load_yaml``,
``parse_yaml``) and the ``--set key.path=value`` overrides (``apply_overrides``). Every refusal
is one ``ConfigError`` naming the file (or ``--set KEY``) and the key. Torch-free.
"""

from __future__ import annotations

import copy
from collections.abc import Hashable
from typing import Any

import yaml

from moe_core.errors import ConfigError, one_line, shown
from moe_core.fsio import read_bounded

MAX_FILE_BYTES = 1 << 20
"""A config or spec file is at most 1 MiB (the shipped ones are a few KB)."""
MAX_NODES = 100_000
"""Values in one YAML document once its aliases are expanded (an alias bomb has billions)."""
MAX_DEPTH = 50
"""Nesting depth of one YAML document, aliases expanded (a spec nests about 6 deep)."""
_MERGE = "tag:yaml.org,2002:merge"


def _at(mark: Any) -> str:
    return f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""


def _dotted(prefix: str, key: Any) -> str:
    key = str(key) if len(str(key)) <= 100 else shown(key, 100)
    return f"{prefix}.{key}" if prefix else key


class _StrictLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` (no Python tags) that also refuses duplicate keys (YAML keeps the last
    one silently), nesting beyond ``MAX_DEPTH``, documents beyond ``MAX_NODES`` values once
    aliases are expanded, aliases inside what they name, and values a constructor cannot read
    (an integer of 5,000 digits, the date 2024-13-45). Every refusal is one ``ConfigError``
    naming ``name`` (the file, or ``--set KEY``) and the key path under ``root``."""

    def __init__(self, text: str, name: str, root: str = ""):
        super().__init__(text)
        self.name, self.root, self.depth = name, root, 0
        self.paths: dict[int, str] = {}

    def compose_node(self, parent: Any, index: Any) -> Any:
        self.depth += 1
        try:
            if self.depth > MAX_DEPTH:
                raise ConfigError(f"{self.name}: nested deeper than {MAX_DEPTH} levels"
                                  f"{_at(self.peek_event().start_mark)}; flatten it")
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1

    def check_size(self, root: yaml.Node) -> None:
        """Count the values and the depth of the document with its aliases expanded, without
        expanding them (each node is visited once)."""
        done: dict[int, tuple[int, int]] = {}  # id(node) -> (values, depth)
        active: set[int] = set()

        def walk(node: yaml.Node, path: str) -> tuple[int, int]:
            if id(node) in done:
                return done[id(node)]
            where = path or "the top level"
            if id(node) in active:
                raise ConfigError(f"{self.name}: the alias at {where} names a value that "
                                  "contains it; remove the alias")
            self.paths.setdefault(id(node), path)
            active.add(id(node))
            n, depth = 1, 0
            children = (
                [(k, path) for k, _ in node.value] + [
                    (v, _dotted(path, k.value if isinstance(k, yaml.ScalarNode) else "?"))
                    for k, v in node.value]
                if isinstance(node, yaml.MappingNode)
                else [(v, f"{path}[{i}]") for i, v in enumerate(node.value)]
                if isinstance(node, yaml.SequenceNode) else [])
            for child, child_path in children:
                cn, cd = walk(child, child_path)
                n, depth = n + cn, max(depth, cd + 1)
            active.discard(id(node))
            if n > MAX_NODES or depth > MAX_DEPTH:
                raise ConfigError(
                    f"{self.name}: the value at {where}{_at(node.start_mark)} expands to more "
                    f"than {MAX_NODES:,} values or "
                    f"{MAX_DEPTH} levels once its YAML aliases (*name) are expanded; "
                    "write the values out instead of nesting aliases")
            done[id(node)] = (n, depth)
            return n, depth

        walk(root, self.root)

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        try:
            return super().construct_object(node, deep)
        except (ConfigError, yaml.YAMLError):
            raise
        except (ValueError, TypeError, ArithmeticError) as e:
            what = shown(node.value, 40) if isinstance(node, yaml.ScalarNode) else "the value"
            raise ConfigError(
                f"{self.name}: {what} at {self.paths.get(id(node)) or 'the top level'}"
                f"{_at(node.start_mark)} cannot be read ({one_line(e, 80)}); "
                "write a plain number or string") from None

    def construct_mapping(self, node: yaml.Node, deep: bool = False) -> Any:
        if isinstance(node, yaml.MappingNode):
            seen: set[Any] = set()
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=True)
                if key_node.tag == _MERGE or not isinstance(key, Hashable):
                    continue  # merges may repeat keys; an unhashable key is SafeLoader's error
                if key in seen:
                    raise ConfigError(
                        f"{self.name}: duplicate key {_dotted(self.paths.get(id(node), ''), key)}"
                        f"{_at(key_node.start_mark)}: YAML would silently keep the last one; "
                        "keep only one")
                seen.add(key)
        return super().construct_mapping(node, deep)


def parse_yaml(text: str, name: str, root: str = "", hint: str = "") -> Any:
    """Parse one YAML document with ``_StrictLoader``; a ``ConfigError`` naming ``name`` (and
    ending with ``hint``) if it is not valid, bounded YAML."""
    loader = None
    try:
        loader = _StrictLoader(text, name, root)
        node = loader.get_single_node()
        if node is None:
            return None
        loader.check_size(node)
        return loader.construct_document(node)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
        why = "; ".join(str(x) for x in (getattr(e, "context", None),
                                         getattr(e, "problem", None)) if x) or str(e)
        raise ConfigError(one_line(f"{name} is not valid YAML{_at(mark)}: {why}{hint}",
                                   400)) from None
    finally:
        if loader is not None:
            loader.dispose()


def load_yaml(path: str) -> dict[str, Any]:
    """Read a config or spec file: UTF-8, at most ``MAX_FILE_BYTES``, strict YAML
    (``parse_yaml``) with a mapping at the top level."""
    # a named pipe or a device is refused before it is read: never a hang
    raw = read_bounded(path, MAX_FILE_BYTES, "config file", "a YAML file")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"config file {path} is not UTF-8 text (byte 0x{raw[e.start]:02x} at "
                          f"offset {e.start}); save it as UTF-8") from None
    data = parse_yaml(text, str(path))
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must contain a mapping at the top level")
    return data


def parse_override_value(key: str, raw: str) -> Any:
    """The value of ``--set KEY=RAW``, parsed as strict YAML (empty = null)."""
    if raw == "":
        return None
    return parse_yaml(raw, f"--set {key}", root=key,
                      hint=f"; quote a text value, e.g. --set '{key}=\"...\"'")


def override_key(key: str) -> list[str]:
    """The parts of ``--set KEY=...``'s dotted key, at most :data:`MAX_DEPTH` of them (a config
    nests a few levels), each non-empty."""
    parts = key.strip().split(".")
    if len(parts) > MAX_DEPTH:
        raise ConfigError(f"--set {shown(key, 60)}: the key has {len(parts):,} levels, more "
                          f"than {MAX_DEPTH}; a config key nests a few (e.g. optim.lr)")
    if not all(parts):
        raise ConfigError(f"--set {shown(key, 60)}: the key has an empty part; write "
                          "key.path=value, e.g. optim.lr=1e-3")
    return parts


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``key.path=value`` overrides (values parsed as YAML) to a nested mapping.

    Intermediate mappings are created only under keys that exist in a dataclass schema; the
    final validation (``train_config_from_dict``) rejects unknown keys with their full path.
    """
    out = copy.deepcopy(data)
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"--set {item!r} must look like key.path=value")
        key, raw = item.split("=", 1)
        parts = override_key(key)
        value = parse_override_value(key, raw)
        node = out
        for p in parts[:-1]:
            if node.get(p) is None:
                node[p] = {}
            if not isinstance(node[p], dict):
                raise ConfigError(f"--set {key}: {p} is not a mapping")
            node = node[p]
        node[parts[-1]] = value
    return out

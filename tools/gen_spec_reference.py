"""Write docs/reference/spec.md: every YAML key of a training config and of a sweep spec, with
its type, default, meaning and the rules its validation enforces, generated from the frozen
config dataclasses (their attribute docstrings) so that the page cannot drift from the code.

    python tools/gen_spec_reference.py            # rewrite docs/reference/spec.md
    python tools/gen_spec_reference.py --check    # exit 1 if the committed page is stale

tests/test_docs.py runs the check. Keys come from ``dataclasses.fields``; a field's meaning is
the string literal right below it in the class body; its rules are the validation messages
(string literals in the dataclass modules) that start with the field's dotted key.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import importlib
import re
import sys
import types
import typing
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "docs" / "reference" / "spec.md"

# Top-level spec fields whose YAML key differs from the dataclass field (None: not a YAML key).
SPEC_YAML = {"name": "sweep", "wandb": "logging.wandb", "max_failures": "failure.max_failures",
             "asha": "scheduler", "path": None, "settings": None}
# Modules whose string literals hold the validation messages.
RULE_MODULES = ("moe_core.config", "moe_core.train.config", "moe_core.data.config",
                "moe_core.schedules", "sweeps.spec.sweep", "sweeps.spec.space", "sweeps.spec.space",
                "sweeps.spec.trials", "sweeps.spec.searchers", "sweeps.law.algorithm",
                "sweeps.law.config", "sweeps.run.prune",
                "sweeps.spec.budget")


def _class_docstrings(cls: type) -> dict[str, str]:
    """Attribute docstrings: the string literal after each annotated field of ``cls``."""
    out, body = {}, _class_node(cls).body
    for a, b in zip(body, body[1:]):
        if (isinstance(a, ast.AnnAssign) and isinstance(a.target, ast.Name)
                and isinstance(b, ast.Expr) and isinstance(b.value, ast.Constant)
                and isinstance(b.value.value, str)):
            out[a.target.id] = " ".join(b.value.value.split())
    return out


def _literal_text(node: ast.AST) -> str | None:
    """A string literal's text; an f-string's with each placeholder shown as ``…``."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "…" for v in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _literal_text(node.left), _literal_text(node.right)
        return None if left is None or right is None else left + right
    return None


def _call_strings(tree: ast.AST) -> list[str]:
    """The string arguments of every call under ``tree`` (the validation messages)."""
    out: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            for arg in node.args:
                text = _literal_text(arg)
                if text:
                    out.append(" ".join(text.split()))
    return out


def _messages() -> list[str]:
    """Every message of the rule modules."""
    out: list[str] = []
    for name in RULE_MODULES:
        mod = importlib.import_module(name)
        out += _call_strings(ast.parse(Path(mod.__file__).read_text()))
    return out


def _class_node(cls: type) -> ast.ClassDef:
    tree = ast.parse(Path(sys.modules[cls.__module__].__file__).read_text())
    return next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)
                and n.name == cls.__name__)


def _rules(path: str, messages: list[str], local: list[str]) -> list[str]:
    """Messages naming ``path`` (or a dotted suffix of it: ``router.order`` for
    ``moe.router.order``; in the class's own messages ``local`` also the bare field name)
    first, as ``key=… must be …``; the key part is cut off."""
    parts = path.split(".")
    keys = [".".join(parts[i:]) for i in range(len(parts)) if len(parts) - i >= 2] or [path]
    seen: list[str] = []
    for msg, bare in [(m, True) for m in local] + [(m, False) for m in messages]:
        for key in keys + ([parts[-1]] if bare else []):
            # in the class's own messages the bare name may carry any section prefix
            pre = r"(?:[\w.]+\.)?" if bare and key == parts[-1] else ""
            m = re.match(rf"(missing required key )?{pre}{re.escape(key)}(=…|=\S+)?\s+(.*)",
                         msg)
            if m and (m.group(2) or m.group(1) or m.group(3).startswith(("must", "is ", "needs"))):
                rule = ("required" if m.group(1) else m.group(3)).rstrip(".")
                if rule not in seen:
                    seen.append(rule)
                break
    return seen


def _type_name(tp: Any) -> str:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Literal:
        return " \\| ".join(f"`{a}`" if isinstance(a, str) else str(a).lower() for a in args)
    if origin in (typing.Union, types.UnionType):
        return " \\| ".join("null" if a is type(None) else _type_name(a) for a in args)
    if origin in (tuple, list):
        inner = [a for a in args if a is not Ellipsis]
        return f"list of {', '.join(_type_name(a) for a in inner)}" if inner else "list"
    if origin is dict:
        return "mapping"
    if dataclasses.is_dataclass(tp):
        return "mapping"
    if tp is Any:
        return "any"
    return getattr(tp, "__name__", str(tp))


def _default(f: dataclasses.Field) -> str:
    if f.default is not dataclasses.MISSING:
        v = f.default
    elif f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        v = f.default_factory()  # type: ignore[misc]
        if dataclasses.is_dataclass(v):
            return "(its defaults)"
    else:
        return "required"
    if v is None:
        return "`null`"
    if isinstance(v, bool):
        return f"`{str(v).lower()}`"
    if isinstance(v, tuple):
        v = list(v)
    return f"`{v!r}`" if not isinstance(v, str) else (f"`{v}`" if v else '`""`')


def _inner_dataclass(tp: Any) -> type | None:
    if dataclasses.is_dataclass(tp):
        return tp
    for a in typing.get_args(tp):
        found = _inner_dataclass(a)
        if found:
            return found
    return None


def _named_pairs(tp: Any) -> bool:
    """``tuple[tuple[str, SomeDataclass], ...]``: a mapping of names to settings."""
    args = typing.get_args(tp)
    if typing.get_origin(tp) is not tuple or not args:
        return False
    inner = typing.get_args(args[0])
    return len(inner) == 2 and inner[0] is str and dataclasses.is_dataclass(inner[1])


def _esc(text: str) -> str:
    return text.replace("|", "\\|")


def _section(cls: type, path: str, messages: list[str], seen: dict[type, str],
             yaml_names: dict[str, str | None] | None = None,
             extra: list[tuple[str, Any, str, str]] = ()) -> list[str]:
    """The table of ``cls`` at ``path`` (and the ``extra`` rows: name, type, default, meaning),
    then its nested sections (a class documented once; later uses point back to it)."""
    seen[cls] = path
    hints = typing.get_type_hints(cls)
    docs = _class_docstrings(cls)
    local = _call_strings(_class_node(cls))
    head = f"`{path}`" if path else "top level"
    lines = [f"## {head} {{#{_anchor(path or 'top')}}}", ""]
    if cls.__doc__ and not cls.__doc__.startswith(cls.__name__ + "("):
        lines += [" ".join(cls.__doc__.split()), ""]
    lines += [f"*{cls.__module__}.{cls.__name__}*", "",
              "| key | type | default | meaning | rules |", "| --- | --- | --- | --- | --- |"]
    rows = []
    for f in dataclasses.fields(cls):
        name = (yaml_names or {}).get(f.name, f.name)
        if name is None:
            continue
        if not docs.get(f.name, "").strip():
            raise SystemExit(f"{cls.__module__}.{cls.__name__}.{f.name} has no docstring: add "
                             "one below the field (the spec reference is made from them)")
        rows.append((name, hints[f.name], _default(f), docs[f.name]))
    nested = []
    for name, tp, default, meaning in [*rows, *extra]:
        key = f"{path}.{name}" if path else name
        if _named_pairs(tp):  # rule name -> settings (``prune: {<rule>: {...}}``)
            key = f"{path}.<{name.removesuffix('s')}>"
        sub = _inner_dataclass(tp)
        if sub is not None and sub in seen:
            meaning += f" (keys as [`{seen[sub]}`](#{_anchor(seen[sub])}))"
        elif sub is not None:
            meaning += f" (keys: [`{key}`](#{_anchor(key)}))"
            nested.append((sub, key))
        rules = "; ".join(_rules(key, messages, local))
        lines.append(f"| `{key}` | {_type_name(tp)} | {default} | "
                     f"{_esc(meaning.strip())} | {_esc(rules)} |")
    lines.append("")
    for sub, key in nested:
        lines += _section(sub, key, messages, seen)
    return lines


def _settings_rows() -> list[tuple[str, Any, str, str]]:
    """A row per algorithm with its own settings block (``algorithm: law``'s ``law:``)."""
    from sweeps.spec.algorithm import SEARCHERS, plugin

    return [(p.settings_key, p.settings_type | None, "`null`",
             f"``algorithm: {p.name}``'s settings (``{p.settings_type.__module__}."
             f"{p.settings_type.__name__}``).")
            for p in map(plugin, SEARCHERS) if p.settings_key is not None]


def _anchor(path: str) -> str:
    """The section's explicit heading id: ``moe.router`` → ``moe-router``."""
    return re.sub(r"[^a-z0-9]+", "-", path.lower()).strip("-")


def render() -> str:
    sys.path.insert(0, str(ROOT))
    from moe_core.config import ModelConfig
    from moe_core.train.config import TrainConfig
    from sweeps.spec import sweep as spec_mod

    messages = _messages()
    seen: dict[type, str] = {}
    lines = [
        "# Spec reference",
        "",
        "<!-- generated by tools/gen_spec_reference.py from the config dataclasses; do not edit "
        "by hand: edit the field's docstring and rerun it (tests/test_docs.py fails when this "
        "page is stale) -->",
        "",
        "Every key of a sweep spec (`python -m sweeps.run SPEC.yaml`) and of a training config "
        "(`python -m moe_core.train CONFIG.yaml`, and the `base:` of every spec), with its type, "
        "default, meaning and the rules checked before any work starts. A key breaking a rule "
        "is refused in one line that names it (`error: moe.top_k=4 exceeds moe.num_experts=2; "
        "...`), exit code 2. *Rules* are those messages, with the offending value shown as `…`.",
        "",
        "# Sweep spec",
        "",
    ]
    lines += _section(spec_mod.SweepSpec, "", messages, seen, SPEC_YAML, _settings_rows())
    lines += ["# Training config (`base:`)", ""]
    lines += _section(TrainConfig, "base", messages, seen)
    lines += ["# Model dimensions (not YAML keys)", "",
              "What `model.preset` (`moe_core.presets`) or a `parent.from_pretrained` "
              "checkpoint's config.json resolves to; shown for reference, set through them.", ""]
    lines += _section(ModelConfig, "ModelConfig", messages, seen)
    text = "\n".join(lines).rstrip() + "\n"
    for key in sorted(spec_mod.top_keys()):
        if f"| `{key}" not in text:
            raise SystemExit(f"top-level spec key {key!r} is missing from the reference: map it "
                             "in SPEC_YAML of tools/gen_spec_reference.py")
    return text


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if the page is stale")
    args = ap.parse_args(argv)
    text = render()
    if args.check:
        if not OUT.exists() or OUT.read_text() != text:
            print(f"{OUT.relative_to(ROOT)} is stale: run python tools/gen_spec_reference.py",
                  file=sys.stderr)
            return 1
        return 0
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(text)
    print(f"wrote {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The project's layout, checked from the source (the re-partition's "done when"):
no import circle, no upward import (analysis → sweeps → {moe_core, scaling}; scaling is pure
maths and of the project imports only the exception tree), few in-function imports of the
project's own modules, and no function over 80 lines in any package."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAYERS = ("moe_core", "scaling", "sweeps", "analysis", "upcycle_sweeps")
ALLOWED = {  # what each package may import of the project (a prefix: a package or a module)
    "moe_core": ("moe_core",),
    "scaling": ("scaling", "moe_core.errors"),
    "sweeps": ("sweeps", "moe_core", "scaling"),
    "analysis": ("analysis", "sweeps", "moe_core", "scaling"),
    "upcycle_sweeps": ("upcycle_sweeps", "analysis", "sweeps", "moe_core", "scaling"),
}
# In-function imports of the project's own modules, each for a reason:
LAZY_OK = {
    ("moe_core.train.engine", "moe_core.train.parallel"),  # DeepSpeed-MoE only for MoE runs
    ("sweeps.run.cli", "sweeps.run.driver"),  # Ray only when a sweep starts (not --dry-run)
    ("sweeps.plan.build", "moe_core.hf.save"),  # torch only for export: hf (not for a dry run)
    ("analysis.best", "moe_core.hf.export"),  # torch only for --export (analysis is torch-free)
    ("sweeps.run.driver", "sweeps.run.wandb_logging"),  # wandb only when a sweep logs to W&B
}
MAX_LINES = 80


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in LAYERS:
        for f in (ROOT / pkg).rglob("*.py"):
            name = ".".join(f.relative_to(ROOT).with_suffix("").parts)
            out[name.removesuffix(".__init__")] = f
    return out


def _imports(mods: dict[str, Path]) -> tuple[dict[str, set[str]], set[tuple[str, str]]]:
    """(module → project modules it imports, (module, target) pairs imported in a function)."""

    def resolve(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    edges: dict[str, set[str]] = {m: set() for m in mods}
    inner: set[tuple[str, str]] = set()
    for m, f in mods.items():
        tree = ast.parse(f.read_text())
        in_func = {id(n) for fn in ast.walk(tree)
                   if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))
                   for n in ast.walk(fn) if isinstance(n, (ast.Import, ast.ImportFrom))}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            else:
                continue
            for t in {resolve(n) for n in names} - {None, m}:
                edges[m].add(t)  # a package's __init__ re-exporting a submodule counts too
                if id(node) in in_func:
                    inner.add((m, t))
    return edges, inner


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_circle_and_no_upward_import():
    edges, _ = _imports(_modules())
    assert _cycles(edges) == []
    upward = [(m, t) for m, ts in edges.items() for t in ts
              if not any(t == a or t.startswith(a + ".") for a in ALLOWED[m.split(".")[0]])]
    assert upward == []


def test_in_function_imports_of_own_modules_are_the_listed_ones():
    _, inner = _imports(_modules())
    assert inner <= LAZY_OK, sorted(inner - LAZY_OK)


def test_functions_are_short_in_every_package():
    files = sorted(f for pkg in LAYERS for f in (ROOT / pkg).rglob("*.py"))
    long = []
    for f in files:
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_LINES:
                    long.append(f"{f.relative_to(ROOT)}:{node.name} ({n} lines)")
    assert long == []


def test_sweeps_is_folders_by_stage_and_design_md_names_every_module():
    """No module flat in ``sweeps/`` (each lives in its stage's folder), and docs/design.md names
    every module of ``sweeps/`` by its dotted path (``__init__``/``__main__`` aside)."""
    flat = sorted(f.name for f in (ROOT / "sweeps").glob("*.py") if f.name != "__init__.py")
    assert flat == []
    design = (ROOT / "docs" / "design.md").read_text()
    mods = sorted(".".join(f.relative_to(ROOT).with_suffix("").parts)
                  for f in (ROOT / "sweeps").rglob("*.py")
                  if f.stem not in ("__init__", "__main__"))
    assert len(mods) > 20
    assert [m for m in mods if f"`{m}`" not in design and f"{m} " not in design] == []


def test_each_stage_names_its_public_api_and_where_each_name_lives():
    """Every stage folder's ``__init__`` has an ``__all__`` whose names are all in its lazy
    export table (``moe_core.lazy``), so importing a stage loads no submodule (no Ray, no torch
    for ``--dry-run``); ``sweeps/best`` and ``sweeps/compare`` only forward the old commands."""
    for init in sorted((ROOT / "sweeps").glob("*/__init__.py")):
        if init.parent.name in ("best", "compare"):
            continue
        tree = ast.parse(init.read_text())
        names = [ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.Assign)
                 and any(getattr(t, "id", None) == "__all__" for t in n.targets)]
        tables = [ast.literal_eval(c.args[1]) for c in ast.walk(tree)
                  if isinstance(c, ast.Call) and getattr(c.func, "id", "") == "lazy_exports"]
        assert names and tables, init
        assert set(names[0]) <= set(tables[0]), init
        assert not [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))
                    and getattr(n, "module", "") != "moe_core.lazy"], init

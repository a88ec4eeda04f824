"""Import direction: moe_core never pulls in Ray, W&B or Optuna (STYLE.md)."""

import ast
import subprocess
import sys
from pathlib import Path


def test_moe_core_does_not_import_ray_or_wandb():
    code = (
        "import sys, moe_core, moe_core.model, moe_core.moe.layer, moe_core.params;"
        "bad=[m for m in ('ray','wandb','optuna') if m in sys.modules];"
        "print(','.join(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"moe_core imported {out.stdout.strip()}"


def test_moe_core_errors_is_cheap():
    code = "import sys, moe_core.errors; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


ANALYSIS = ("fit", "derived", "data", "decide", "sweep", "sections", "plots", "claims",
            "cli", "report", "best", "compare", "twoway", "wandb_workspace")


def test_analysis_imports_neither_torch_nor_ray():
    code = (
        "import sys, " + ", ".join(f"analysis.{m}" for m in ANALYSIS) + ";"
        "bad=[m for m in ('torch','ray','wandb','deepspeed') if m in sys.modules];"
        "print(','.join(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"analysis imported {out.stdout.strip()}"


# analysis' own import graph (module → the analysis modules it imports, anywhere in the file),
# plus its only ways into the rest of the project: the results schema, moe_core.errors, the
# durable writes of moe_core.fsio, the storage layer that reads results from object storage
# (sweeps.store.storage), the law math of the scaling package, the torch-free model
# configuration (config, params, presets, hf_config), sweeps.plan.cost and sweeps.spec.naming
# (none imports torch).
# `python -m analysis.fit` / `analysis.derived` run the packages' __main__, which import the
# command lines (analysis.cli); the libraries themselves do not (cli imports them).
ANALYSIS_GRAPH = {
    "fit": set(),
    "fit.__main__": {"cli"},
    "derived": set(),
    "derived.__main__": {"cli"},
    "data": set(),
    "decide": {"data", "decide.extrapolation", "decide.labels", "decide.result", "derived"},
    "decide.extrapolation": set(),
    "decide.labels": {"decide.extrapolation"},
    "decide.result": {"decide.labels"},
    "decide.plan": {"decide.extrapolation", "derived"},
    "decide.__main__": {"cli"},
    "noise": {"data"},
    "noise.__main__": {"cli"},
    "sweep": {"data"},
    "sections": {"data", "decide", "derived", "sweep"},
    "plots": {"derived", "sweep"},
    "claims": {"sweep"},
    "cli": {"data", "decide", "decide.plan", "derived", "noise"},
    "report": {"claims", "cli", "data", "html_page", "importance", "plots", "sections", "sweep",
               "twoway"},
    "best": set(),
    "compare": {"html_page", "importance", "twoway"},
    "twoway": {"claims"},  # the claims' paired-by-seed rule for a "best" (#38)
    "importance": set(),
    "html_page": {"importance", "twoway"},
    "wandb_workspace": {"sweep"},
}
OUTSIDE = {"moe_core.errors", "moe_core.fsio", "sweeps.store.results", "sweeps.plan.cost",
           "sweeps.store.storage", "scaling.laws",
           "scaling.crossing", "scaling.fit", "scaling.bootstrap", "scaling.interval",
           # decide --plan sizes a checkpoint from its config.json and the presets (no torch)
           "moe_core.config", "moe_core.params", "moe_core.presets", "moe_core.hf_config",
           # the two-way views' short knob names; best --export (torch, imported on use)
           "sweeps.spec.naming", "moe_core.hf.export",
           # --out never into a folder this project did not write; the bootstrap cap
           "moe_core.outdir", "sweeps.law.limits",
           # a results folder or bucket URL (pyarrow.fs, no torch)
           "moe_core.location",
           # the report's provenance line (no torch or Ray: importlib.metadata)
           "sweeps.store.provenance",
           # the W&B keys of the columns, which the workspace's panels name (pure)
           "sweeps.store.wandb_keys"}


ROOT = Path(__file__).resolve().parents[1]


def _analysis_modules() -> dict[str, Path]:
    root = ROOT / "analysis"
    out = {}
    for f in root.rglob("*.py"):
        name = ".".join(f.relative_to(root).with_suffix("").parts).removesuffix("__init__")
        if name:
            out[name.rstrip(".")] = f
    return out


def _project_imports(path: Path) -> set[str]:
    """Modules of the project a file imports (``from pkg import mod`` as ``pkg.mod``)."""
    packages = ("analysis", "sweeps", "moe_core", "scaling")
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            pkg = ROOT.joinpath(*node.module.split("."))  # a package: its named submodules
            subs = [a.name for a in node.names
                    if (pkg / f"{a.name}.py").is_file() or (pkg / a.name).is_dir()]
            mods = [f"{node.module}.{s}" for s in subs] or [node.module]
        elif isinstance(node, ast.Import):
            mods = [a.name for a in node.names]
        else:
            continue
        out |= {m for m in mods if m.split(".")[0] in packages}
    return out


def test_analysis_import_graph_is_the_declared_layering():
    mods = _analysis_modules()
    graph, outside = {}, set()
    for name, path in mods.items():
        deps = _project_imports(path)
        graph[name] = {m for m in mods for d in deps if d == f"analysis.{m}"}
        outside |= {d for d in deps if not d.startswith("analysis.")}
    assert graph == ANALYSIS_GRAPH
    assert outside <= OUTSIDE, outside
    # no circles: peel off modules whose imports are all peeled already
    left = dict(graph)
    while left:
        free = [m for m, deps in left.items() if not deps & set(left)]
        assert free, f"import cycle among {sorted(left)}"
        for m in free:
            del left[m]


def test_fit_and_derived_do_not_load_the_command_lines():
    code = ("import sys, analysis.fit, analysis.derived, analysis.sections, analysis.plots;"
            "print('analysis.cli' in sys.modules, 'analysis.report' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_scaling_imports_numpy_and_scipy_only():
    """The scaling maths (laws, fits, crossings, post-decay prediction, design bounds) loads with
    torch, Ray, DeepSpeed, transformers and pandas unimportable, and of the project only the
    exception tree (moe_core.errors) and the package's lazy-export table (moe_core.lazy), both
    stdlib only."""
    code = (
        "import sys, importlib.abc\n"
        "class Block(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path, target=None):\n"
        "        if name.split('.')[0] in ('torch', 'ray', 'deepspeed', 'transformers', 'pandas',"
        " 'wandb', 'pyarrow'):\n"
        "            raise ImportError('blocked: ' + name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "import scaling, scaling.laws, scaling.fit, scaling.crossing, scaling.predict\n"
        "import scaling.bootstrap, scaling.interval\n"
        "import scaling.design\n"
        "own = sorted(m for m in sys.modules if m.split('.')[0] in ('moe_core', 'sweeps', "
        "'analysis'))\n"
        "print(','.join(own))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "moe_core,moe_core.errors,moe_core.lazy"

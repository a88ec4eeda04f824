"""The documentation site: the generated spec reference is current, ``mkdocs build --strict``
passes, and every command the docs show is run by a test or marked as needing a GPU or a
cloud."""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _generator():
    spec = importlib.util.spec_from_file_location("gen_spec_reference",
                                                  ROOT / "tools" / "gen_spec_reference.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.slow
def test_spec_reference_is_current():
    """docs/reference/spec.md equals what tools/gen_spec_reference.py makes from the config
    dataclasses now (rerun the tool after changing a field or its docstring)."""
    gen = _generator()
    assert gen.OUT.read_text() == gen.render(), \
        "docs/reference/spec.md is stale: run python tools/gen_spec_reference.py"


def test_spec_reference_lists_every_field_of_every_section():
    """Every field of every config dataclass reachable from the spec appears as a key row."""
    import dataclasses
    import typing

    from moe_core.train.config import TrainConfig
    from sweeps.spec.algorithm import SEARCHERS, plugin
    from sweeps.spec.sweep import SweepSpec

    gen = _generator()
    page = gen.OUT.read_text()
    rows = [line.split("|")[1].strip().strip("`") for line in page.splitlines()
            if line.startswith("| `")]
    leaves = {r.rsplit(".", 1)[-1] for r in rows}
    seen, todo = set(), [SweepSpec, TrainConfig]  # and each algorithm's settings block:
    todo += [p.settings_type for p in map(plugin, SEARCHERS) if p.settings_type is not None]
    while todo:
        cls = todo.pop()
        if cls in seen:
            continue
        seen.add(cls)
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            name = gen.SPEC_YAML.get(f.name, f.name) if cls is SweepSpec else f.name
            if name is None:
                continue
            assert name.rsplit(".", 1)[-1] in leaves or gen._named_pairs(hints[f.name]), \
                f"{cls.__name__}.{f.name} is missing from docs/reference/spec.md"
            sub = gen._inner_dataclass(hints[f.name])
            if sub is not None:
                todo.append(sub)
    assert len(rows) > 100


# ---- commands shown in the docs --------------------------------------------------------------


FENCE = re.compile(r"^```([\w-]*)[ \t]*\n(.*?)^```", re.M | re.S)
SHELL = ("bash", "sh", "shell")
"""Fences whose every line is a command; in other fences (output transcripts) only the lines
that start with a ``$ `` prompt are."""
NEEDS = re.compile(r"#\s*needs:\s*(gpu|cloud)\b")
"""``# needs: gpu`` / ``# needs: cloud``: on a line of its own it marks the whole block, after a
command that command."""
ENTRY_WORDS = {"python", "python3", "make", "bash", "sh", "ray", "kubectl", "upcycle-sweeps",
               "pytest", "mkdocs"}
"""Commands a reader runs; other first words (``export``, ``cd``, ``S=$(...)``) are shell
plumbing and not checked."""


def doc_commands(text: str) -> list[tuple[str, bool]]:
    """(command, marked) for every command line of every fenced block of ``text`` (each line
    of a ```bash block, the ``$ `` lines of others): lines joined at a trailing backslash,
    split at ``&&``, ``||`` and ``;``; ``marked`` when the block or the line says
    ``# needs: gpu|cloud``."""
    out = []
    for block in FENCE.finditer(text):
        body = block.group(2).replace("\\\n", " ")
        lines = body.splitlines()
        whole = any(NEEDS.search(ln) and ln.strip().startswith("#") for ln in lines)
        for line in lines:
            if block.group(1) not in SHELL and not line.startswith("$ "):
                continue
            line = line.strip().removeprefix("$ ")
            if not line or line.startswith("#"):
                continue
            marked = whole or bool(NEEDS.search(line))
            for part in re.split(r"&&|\|\||;", line.split(" #")[0]):
                if part.strip():
                    out.append((" ".join(part.split()), marked))
    return out


def _words(command: str) -> list[str]:
    try:
        words = shlex.split(command)
    except ValueError:
        words = command.split()
    while words and (re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[0]) or
                     words[0] in ("env", "time", "timeout")):
        words = words[1:] if not words[0] == "timeout" else words[2:]
    return words


def _script_entries(text: str) -> list[str]:
    """The modules and scripts a Makefile recipe or a shell script runs."""
    found = re.findall(r"-m\s+([A-Za-z_][\w.]*)", text)
    found += re.findall(r"\b((?:bench|studies|tools)/[\w/]+\.py)\b", text)
    return [f for f in found if f != "pip"]


def _make_recipe(target: str) -> str:
    lines, out, inside = (ROOT / "Makefile").read_text().splitlines(), [], False
    for line in lines:
        if re.match(rf"^{re.escape(target)}:", line):
            inside = True
            continue
        if inside and line.startswith("\t"):
            out.append(line)
        elif inside and line.strip() and not line.startswith("\t"):
            break
    return "\n".join(out)


def entries(command: str) -> list[str]:
    """What a test must mention for ``command`` to count as run: the module of ``python -m X``,
    the path of ``python path.py``, what a ``make`` target's recipe runs, a ``bash`` script's path,
    or the tool and its sub-command (``ray up``). ``[]``: the test runner itself."""
    words = _words(command)
    if not words or words[0] not in ENTRY_WORDS:
        return []
    head = words[0]
    if head in ("python", "python3"):
        if "-m" in words:
            mod = words[words.index("-m") + 1]
            return [] if mod == "pytest" else [mod]
        return [w for w in words[1:] if w.endswith(".py")][:1]
    if head == "make":
        target = words[1] if len(words) > 1 else "venv"
        recipe = _make_recipe(target)
        if target == "test" or "-m pytest" in recipe:
            return []
        scripts = re.findall(r"bash\s+(\S+\.sh)", recipe)
        return _script_entries(recipe) + [e for sh in scripts
                                          for e in _script_entries((ROOT / sh).read_text())]
    if head in ("bash", "sh"):  # a test that runs the script names it
        return [words[1]]
    if head == "pytest":
        return []
    return [" ".join(words[:2])]


def _tests_text() -> str:
    return "\n".join(p.read_text(errors="replace") for p in (ROOT / "tests").rglob("*.py")
                     if p.name != "test_docs.py")


def _mentioned(entry: str, tests: str) -> bool:
    if entry.endswith(".py"):
        return entry in tests or Path(entry).name in tests or \
            entry[:-3].replace("/", ".") in tests
    return entry in tests


def unchecked_commands(text: str, tests: str) -> list[str]:
    """Commands of ``text`` that no test runs and that are not marked as needing a GPU or a
    cloud."""
    bad = []
    for command, marked in doc_commands(text):
        if marked:
            continue
        missing = sorted({e for e in entries(command) if not _mentioned(e, tests)})
        if missing:
            bad.append(f"{command}  (no test mentions {', '.join(missing)})")
    return bad


def _doc_pages() -> list[Path]:
    pages = [ROOT / "README.md"]
    return pages + sorted((ROOT / "docs").rglob("*.md"))


def test_every_command_in_the_docs_is_tested_or_marked():
    tests = _tests_text()
    bad = []
    for page in _doc_pages():
        bad += [f"{page.relative_to(ROOT)}: {c}"
                for c in unchecked_commands(page.read_text(), tests)]
    assert not bad, "commands no test runs; test them or mark the block '# needs: gpu' / " \
        "'# needs: cloud':\n" + "\n".join(bad)


def test_command_check_can_fail():
    """The checker itself: an unknown module is reported, a marked block and a tested module
    are not, a make target is followed into its recipe."""
    md = ("```bash\npython -m nowhere.tool --x 1 \\\n    --y 2\nexport A=1 && python -m "
          "analysis.best r\n```\n\n```bash\n# needs: cloud\nray up c.yaml\n```\n"
          "```bash\nray up c.yaml\nmake demo\n```\n"
          "```\n$ python -m shown.in.output --a\npython -m not.a.command\n```\n")
    bad = unchecked_commands(md, "analysis.best sweeps.run")
    assert [b.split("  ")[0] for b in bad] == ["python -m nowhere.tool --x 1 --y 2",
                                                "ray up c.yaml", "python -m shown.in.output --a"]
    assert entries("make demo") == ["sweeps.run"]
    assert entries("make test") == []


@pytest.mark.slow
def test_mkdocs_build_strict(tmp_path):
    """``mkdocs build --strict`` of the site: no warning at all."""
    cmd = [sys.executable, "-m", "mkdocs", "build", "-q", "-f", str(ROOT / "mkdocs.yml"),
           "-d", str(tmp_path / "site"), "--strict"]
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    warnings = [ln for ln in (r.stdout + r.stderr).splitlines()
                if ln.startswith(("WARNING", "ERROR"))]
    assert r.returncode == 0 and not warnings, "\n".join(warnings) or r.stderr[-2000:]
    assert (tmp_path / "site" / "reference" / "spec" / "index.html").is_file()


LINK = re.compile(r"\]\(([^)\s]+)\)")


def test_readme_is_short_and_no_link_leaves_the_repository():
    """README.md is a front door (≤ 250 lines); no link of README.md, CHANGELOG.md or the docs
    points outside the repository (no URL, no path above it), and README's and CHANGELOG's
    relative links name files that exist."""
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 250
    bad = []
    for page in [ROOT / "CHANGELOG.md"] + _doc_pages():
        for target in LINK.findall(page.read_text()):
            path = target.split("#")[0]
            if re.match(r"^[a-z][a-z0-9+.-]*:|^//", target):
                bad.append(f"{page.relative_to(ROOT)}: {target} (a URL)")
            elif path and not (page.parent / path).resolve().is_relative_to(ROOT):
                bad.append(f"{page.relative_to(ROOT)}: {target} (outside the repository)")
            elif path and page.parent == ROOT and not (ROOT / path).exists():
                bad.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
    assert not bad, "\n".join(bad)

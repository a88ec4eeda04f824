"""Markdown report with tables and PNG plots for a sweep's results directory.

    python -m analysis.report results/upcycle_lr            # → results/upcycle_lr/report.md
                                                            #   (+ report.html, report.json)
    python -m analysis.report results/                      # every sweep below results/
    python -m analysis.report results/transition_tau --baseline results/expert_baselines
    python -m analysis.report results/upcycle_lr --out docs/findings/upcycle_lr
    python -m analysis.report results/scaling_d1_d2 --paper-d-star   # + 000 Table 2's D*

Sections: compute ledger (tokens trained, tokens saved by shared parents and WSD branches, FLOPs,
wall time); provenance (code commit, library versions, device: ``sweeps.store.provenance``);
results by configuration (mean ± std over seeds of the final eval and router statistics); loss
curves; two knobs at a time (joint tables and interaction plots per pair of varied knobs,
``analysis.twoway``; over a folder, index.md adds the cells its sweeps share);
the metric and router statistics against the knob; scaling-law fits when the sweep varies D1
and D2 (000 Table 1, Fig. 4, Eq. 10) or sparsity and active parameters
(000 §4.2); should I upcycle (000 §5: analysis.decide, when the baseline or the sweep has
from-scratch MoE runs); expert-upcycling efficiency η against from-scratch baselines (003 Eq. 4);
and the
seeds' claims this sweep can test, each with a verdict computed from the numbers (analysis.claims).

This module only assembles: the sections are :mod:`analysis.sections`, the figures
:mod:`analysis.plots`, the verdicts :mod:`analysis.claims`.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from analysis.claims import Claim, evaluate_claims
from analysis.cli import _kv, check_numbers, one_line_errors
from analysis.data import is_sweep_dir, sweep_dirs
from analysis.html_page import sweep_page
from analysis.importance import ImportanceTable, importance
from analysis.plots import plot_curves, plot_d_star, plot_finals, plot_law_fit
from analysis.sections import (
    LawFigure,
    decision_section,
    efficiency_section,
    groups_section,
    ledger_section,
    md_table,
    model_config_section,
    provenance_section,
    transition_section,
    upcycled_law_section,
)
from analysis.sweep import Sweep, load_sweep
from analysis.twoway import plot_overlay, shared_cells, shared_markdown, twoway_lines
from moe_core.errors import FitError
from moe_core.fsio import atomic_write_text
from moe_core.outdir import claim_out_dir, mark_out_dir
from sweeps.store.storage import is_url

D_STAR_CAPTION = ("The paper's D* (000 Eq. 13) from 000 Table 2's **published** parameters, "
                  "numerically and by Eq. 2 — not fitted to this sweep (one model size cannot "
                  "fit the N1 dependence); drawn because `--paper-d-star` asked for it.")


def _figure_lines(s: Sweep, out_dir: Path, base: Sweep | None) -> list[str]:
    lines = []
    p = plot_curves(s, out_dir / "curves.png", baseline=base)
    if p:
        lines += [f"![curves]({p.name})", ""]
    p = plot_finals(s, out_dir / "finals.png")
    if p:
        lines += [f"![finals]({p.name})", ""]
    return lines


def _twoway_lines(s: Sweep, out_dir: Path) -> list[str]:
    """Joint tables and interaction plots for each pair of varied knobs (``analysis.twoway``):
    a claim about one knob is read at fixed values of the others."""
    got, _ = twoway_lines(s.name, s.rows.to_dict("records"), "val_loss", out_dir, "twoway")
    return ["## Two knobs at a time", "", *got] if got else []


def _importance(s: Sweep, evaluator: str) -> ImportanceTable:
    """Which knob matters most for the final val_loss (``analysis.importance``)."""
    return importance(s.rows.to_dict("records"), "val_loss", "min", evaluator)


def _importance_lines(t: ImportanceTable) -> list[str]:
    return ["## Parameter importance", "", *t.markdown()] if t.knobs else []


def _law_figure_lines(fig: LawFigure | None, out_dir: Path,
                      paper_d_star: bool = False) -> list[str]:
    if fig is None:
        return []
    p = plot_law_fit(out_dir / "law_fit.png", fig.data, fig.law, fig.params, fig.points,
                     fig.residuals)
    if not paper_d_star:  # the published law is not the user's: only on request
        return [f"![law fit]({p.name})", ""]
    p2 = plot_d_star(out_dir / "d_star.png")
    return [f"![law fit]({p.name})", "", D_STAR_CAPTION, "", f"![D*]({p2.name})", ""]


def _claim_lines(claims: list[Claim]) -> list[str]:
    if not claims:
        return []
    return ["## Claims from the seeds", "",
            *md_table(["claim", "source", "verdict", "numbers"],
                      [[_claim_text(c.claim, c.stratum), c.source, f"**{c.verdict}**",
                        c.numbers] for c in claims])]


def _claim_text(claim: str, stratum: str | None) -> str:
    """A claim as the tables show it: with the other knobs' values it held fixed, if any."""
    return f"{claim} [at {stratum}]" if stratum else claim


def _json_default(o):
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, (np.floating, np.integer)):
        return o.item()
    return str(o)


def default_out(path: str | Path, name: str) -> Path:
    """Where a report goes without ``--out``: next to a local sweep's results; for results on
    object storage, the local folder ``reports/<sweep>`` (never a folder named after a URL)."""
    if is_url(path):
        return Path("reports") / name
    path = Path(path)
    return path if path.is_dir() else path.parent


def report(results: str | Path, out: str | Path | None = None, *,
           baseline: str | Path | None = None, bootstrap: int = 200,
           fixed: Mapping[str, float] | None = None, seed_noise: float | None = None,
           paper_d_star: bool = False, evaluator: str = "ped_anova") -> Path:
    """Write ``report.md`` and its PNGs for one sweep's results directory; returns the path."""
    s = load_sweep(results)
    out_dir = Path(out) if out else default_out(s.path, s.name)
    out_dir.mkdir(parents=True, exist_ok=True)
    base = load_sweep(baseline) if baseline else None
    led, groups, prov = ledger_section(s), groups_section(s), provenance_section(s)
    law = upcycled_law_section(s, bootstrap, fixed)
    cfg, tr, eff = model_config_section(s), transition_section(s), efficiency_section(s, base)
    dec = decision_section(s, base, bootstrap)
    claims = evaluate_claims(s, law_info=law.data, efficiency=eff.data, transition=tr.data,
                             seed_noise=seed_noise)
    imp = _importance(s, evaluator)
    lines = [f"# Sweep report: {s.name}", "",
             f"Results: `{s.path}`; {len(s.finals)} finished trials; generated by "
             f"`python -m analysis.report`.", "",
             *led.lines, *prov.lines, *groups.lines, *_figure_lines(s, out_dir, base),
             *_twoway_lines(s, out_dir), *_importance_lines(imp),
             *law.lines, *_law_figure_lines(law.figure, out_dir, paper_d_star), *dec.lines,
             *cfg.lines, *tr.lines, *eff.lines, *_claim_lines(claims)]
    md = out_dir / "report.md"
    atomic_write_text(md, "\n".join(lines) + "\n")
    data = {"sweep": s.name, "ledger": led.data, "provenance": prov.data, "laws": law.data,
            "model_config": cfg.data, "efficiency": eff.data, "transition": tr.data,
            "decision": dec.data, "claims": [c.__dict__ for c in claims], "groups": groups.data,
            "importance": imp.to_json()}
    atomic_write_text(out_dir / "report.json", json.dumps(data, indent=1,
                                                          default=_json_default))
    atomic_write_text(out_dir / "report.html", sweep_page(
        s.name, s.rows.to_dict("records"), importance=imp, claims=data["claims"],
        summary=s.summary))
    return md


def shared_lines(dirs: Sequence[Path], out_dir: Path) -> list[str]:
    """The cells the sweeps under one folder share (the same configuration, seeds aside):
    a table, and an overlay of their curves per pair of sweeps (``analysis.twoway``)."""
    sweeps = {}
    for d in dirs:
        s = load_sweep(d)
        sweeps[s.name if s.name not in sweeps else f"{s.name} ({d})"] = \
            s.rows.to_dict("records")
    cells = shared_cells(sweeps)
    if not cells:
        return []
    lines = ["## Cells the sweeps share", "", "The same configuration (every config column, "
             "seeds aside) run by two sweeps: their final val_loss there, and the curves "
             "overlaid (solid: the first sweep, dashed: the second).", "",
             *shared_markdown(cells, "val_loss")]
    pairs: dict[tuple[str, str], list] = {}
    for c in cells:
        pairs.setdefault(c.sweeps, []).append(c)
    for (a, b), cs in pairs.items():
        name = "shared_" + "_".join("".join(ch if ch.isalnum() else "_" for ch in x)
                                    for x in (a, b)) + ".png"
        p = plot_overlay(sweeps, cs, "val_loss", out_dir / name)
        lines += [f"![{a} and {b}]({p.name})", ""]
    return lines


def write_index(reports: list[Path], path: Path, extra: Sequence[str] = ()) -> Path:
    """One page over several sweeps: the compute ledger per sweep and every claim's verdict."""
    rows, claims = [], []
    tot = {"trials": 0, "spent": 0.0, "alone": 0.0, "flops": 0.0, "wall": 0.0}
    for md in reports:
        d = json.loads(md.with_name("report.json").read_text())
        led = d["ledger"]
        link = f"[{d['sweep']}]({md.relative_to(path.parent).as_posix()})"
        spent, alone = led["tokens_spent"], led["tokens_from_scratch"]
        rows.append([link, led["ok"], spent, alone, f"{1 - spent / alone:.0%}" if alone else "—",
                     led["trial_flops"], led.get("sweep_wall_s")])
        tot["trials"] += led["ok"]
        tot["spent"] += spent
        tot["alone"] += alone
        tot["flops"] += led["trial_flops"] if math.isfinite(led["trial_flops"]) else 0
        tot["wall"] += led.get("sweep_wall_s") or 0
        claims += [[link, _claim_text(c["claim"], c.get("stratum")), c["source"],
                    f"**{c['verdict']}**"] for c in d["claims"]]
    rows.append(["**total**", tot["trials"], tot["spent"], tot["alone"],
                 f"{1 - tot['spent'] / tot['alone']:.0%}" if tot["alone"] else "—",
                 tot["flops"], tot["wall"]])
    lines = ["# Sweep reports", "", "Generated by `python -m analysis.report` over a folder of "
             "results. *Tokens trained*: trials, parents and shared WSD stable runs, each once, "
             "as the sweep ran them; *alone*: had every trial trained its own parent and its "
             "whole budget from the start (no shared parents, no WSD branches).", ""]
    lines += md_table(["sweep", "trials", "tokens trained", "tokens alone", "saved",
                       "trial FLOPs (6·N·D)", "wall (s)"], rows)
    if claims:
        lines += ["## Claims", ""]
        lines += md_table(["sweep", "claim", "source", "verdict"], claims)
    atomic_write_text(path, "\n".join([*lines, "", *extra]) + "\n")
    return path


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m analysis.report",
                                 description="Markdown report with plots for sweep results.")
    ap.add_argument("results", help="a sweep's results directory, or a folder of them")
    ap.add_argument("--out", default=None, help="write report.md and PNGs here instead")
    ap.add_argument("--baseline", default=None,
                    help="from-scratch runs (a results directory) for 003 Eq. 4's η")
    ap.add_argument("--bootstrap", type=int, default=200,
                    help="bootstrap resamples for law-parameter intervals (0: none)")
    ap.add_argument("--fix", action="append", default=[], metavar="NAME=VALUE",
                    help="hold a law parameter fixed in the fits, e.g. --fix E=1.0 (000 §5)")
    ap.add_argument("--seed-noise", type=float, default=None, metavar="NATS",
                    help="the σ of one trial's final loss (e.g. from python -m analysis.noise): "
                         "lets configurations that ran one seed be compared (default: such "
                         "claims say 'needs ≥ 2 seeds')")
    ap.add_argument("--paper-d-star", action="store_true",
                    help="also draw 000 Table 2's published D* law (d_star.png), labelled as the "
                         "paper's")
    ap.add_argument("--importance", choices=("ped_anova", "fanova"), default="ped_anova",
                    help="parameter importance evaluator (optuna.importance; fanova needs "
                         "scikit-learn)")
    ap.add_argument("--only", default=None,
                    help="with a folder: only these sweeps (comma-separated names)")
    ap.add_argument("--debug", action="store_true", help="show tracebacks")
    return ap


def _sweep_dirs(root: Path, only: str | None) -> list[Path]:
    """The sweep directories below ``root`` (those named in ``only``, warning about the rest)."""
    dirs = sweep_dirs(root)
    if only:
        keep = [x.strip() for x in only.split(",") if x.strip()]
        missing = [k for k in keep if k not in {d.name for d in dirs}]
        if missing:
            print(f"warning: --only: no results for {', '.join(missing)} under {root}",
                  file=sys.stderr)
        dirs = [d for d in dirs if d.name in keep]
    if not dirs:
        raise FitError(f"{root} holds no results.parquet (run python -m sweeps.run)")
    return dirs


@one_line_errors
def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    check_numbers(args, ())
    root = args.results if is_url(args.results) else Path(args.results)
    if args.out:  # never into a folder this command did not write, nor into the input
        claim_out_dir(args.out, inputs=[] if is_url(root) else [root])
        mark_out_dir(args.out, "analysis.report")
    fixed = _kv(args.fix, "--fix", True)
    if args.seed_noise is not None and not (math.isfinite(args.seed_noise)
                                            and args.seed_noise > 0):
        raise FitError(f"--seed-noise {args.seed_noise}: give the σ of a trial's final loss in "
                       "nats, a finite number > 0")
    opts = {"baseline": args.baseline, "bootstrap": args.bootstrap, "fixed": fixed,
            "seed_noise": args.seed_noise, "paper_d_star": args.paper_d_star,
            "evaluator": args.importance}
    if is_url(root) and not is_sweep_dir(root):
        raise FitError(f"{root}: a URL must name one sweep's results folder (holding "
                       "results.parquet); report several sweeps one by one with --out")
    if is_url(root) or not root.is_dir() or is_sweep_dir(root):
        print(report(root, args.out, **opts))
        return 0
    reports = []
    for d in _sweep_dirs(root, args.only):
        reports.append(report(d, Path(args.out) / d.name if args.out else None, **opts))
        print(reports[-1])
    out = Path(args.out) if args.out else root
    extra = shared_lines(_sweep_dirs(root, args.only), out)
    print(write_index(reports, out / "index.md", extra))
    return 0


if __name__ == "__main__":
    sys.exit(main())

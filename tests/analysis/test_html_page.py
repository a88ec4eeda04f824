"""The self-contained HTML pages (analysis.html_page): built from synthetic rows, then loaded in a
real browser (headless Chromium) that must report no console error and data in every plot.

The browser part skips only where no Chromium is installed (``.ci/run`` installs Debian's
``chromium`` package when it can)."""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess

import pytest

from analysis.html_page import compare_page, provenance_html, sweep_page
from analysis.importance import importance

CHROMIUM = next((p for p in (shutil.which(n) for n in ("chromium", "chromium-browser",
                                                        "google-chrome")) if p), None)


def _rows(sweep: str = "demo", offset: float = 0.0) -> list[dict]:
    """Two knobs × two seeds of upcycled trials, three evals each, two MoE layers (layer 3
    collapses in the aux_coef=0 trials)."""
    rows = []
    for i, (lr, aux, seed) in enumerate((lr, aux, s) for lr in (1e-3, 3e-3)
                                        for aux in (0.0, 0.01) for s in (0, 1)):
        final = 2.0 + offset + (0.2 if lr == 1e-3 else 0.0) + 0.01 * seed
        for step, tok in ((0, 0), (20, 2000), (40, 4000)):
            collapse = aux == 0.0 and step > 0
            rows.append({
                "sweep": sweep, "trial_id": f"{sweep}{i}", "status": "ok", "kind": "upcycled",
                "seed": seed, "knob.seed": seed, "knob.optim.lr": lr,
                "knob.moe.router.aux_coef": aux, "D1": 5000, "tokens": tok, "step": step,
                "parent_val_loss": 2.4, "val_loss": final + 0.5 * math.exp(-step / 20),
                "router.max_load": 0.4, "router.max_load.worst": 1.0 if collapse else 0.4,
                "router.max_load.layer1": 0.3, "router.max_load.layer3": 1.0 if collapse else 0.4,
                "router.max_vio.layer1": 0.2, "router.max_vio.layer3": 3.0 if collapse else 0.6,
                "router.drop_rate.layer1": 0.0, "router.drop_rate.layer3": 0.0})
    return rows


def _check_in_browser(path, tmp_path) -> dict:
    """Load ``path`` in headless Chromium with a probe script in front of the page's own: it
    records console errors and uncaught exceptions, then counts the plots and those whose
    every trace holds data; the result is read back from the dumped DOM."""
    probe = """<script>
window.__errors = [];
const _err = console.error.bind(console);
console.error = (...a) => { window.__errors.push(a.map(String).join(' ')); _err(...a); };
window.addEventListener('error', e => window.__errors.push('uncaught: ' + e.message));
window.addEventListener('load', () => setTimeout(() => {
  const plots = [...document.querySelectorAll('.plotly-graph-div')];
  const has = t => ['x', 'y', 'z', 'values', 'dimensions'].some(
      k => t[k] && (t[k].length > 0));
  const full = plots.filter(gd => gd.data && gd.data.length && gd.data.every(has)
                                  && gd.querySelector('svg.main-svg'));
  const pre = document.createElement('pre'); pre.id = 'probe';
  pre.textContent = JSON.stringify({plots: plots.length, with_data: full.length,
                                    errors: window.__errors});
  document.body.appendChild(pre);
}, 500));
</script>"""
    page = tmp_path / ("probed_" + path.name)
    page.write_text(path.read_text().replace("<head>", "<head>" + probe, 1))
    p = subprocess.run([CHROMIUM, "--headless", "--disable-gpu", "--no-sandbox",
                        "--no-first-run", "--disable-dev-shm-usage",
                        f"--user-data-dir={tmp_path / 'prof'}",
                        "--virtual-time-budget=15000", "--dump-dom", page.as_uri()],
                       capture_output=True, text=True, timeout=120)
    m = re.search(r'<pre id="probe">(.*?)</pre>', p.stdout, re.S)
    assert m, f"the probe did not run: {p.stderr[-2000:]}"
    import html
    return json.loads(html.unescape(m.group(1)))


def _pages(tmp_path):
    a, b = _rows("a"), _rows("b", 0.1)
    imp = importance(a)
    claims = [{"claim": "lr matters", "source": "000 §3", "verdict": "reproduced",
               "numbers": "Δ=0.2", "stratum": None}]
    prov = {"provenance": {"git": {"commit": "abc123", "dirty": False}, "python": "3.11"}}
    sp = tmp_path / "report.html"
    sp.write_text(sweep_page("a", a, importance=imp, claims=claims, summary=prov))
    cp = tmp_path / "compare.html"
    cp.write_text(compare_page({"a": a, "b": b}, importance={"a": imp, "b": importance(b)}))
    return sp, cp


def test_pages_are_self_contained_and_hold_every_view(tmp_path):
    sp, cp = _pages(tmp_path)
    text = sp.read_text()
    assert not re.search(r"<(script|link|img)[^>]+(src|href)=", text)  # nothing fetched
    assert len(text) > 1_000_000 and "Plotly.newPlot" in text  # plotly.js is inlined
    for needle in ('"type":"parcoords"', "upcycled at D1=5e+03", "parent's final",
                   "mean final val_loss, moe.router.aux_coef", "parameter importance",
                   "router.max_load per MoE layer", "router.max_vio per MoE layer",
                   "lr matters", "reproduced", "Provenance", "git.commit", "abc123",
                   "every MoE layer and eval: router.drop_rate = 0"):
        assert needle in text, needle
    assert "Comparison: a, b" in cp.read_text()
    assert provenance_html({"ok": 3}) == provenance_html(None) == ""  # only when it is there
    assert "router.drop_rate per MoE layer" not in text  # all zero: a line, not a plot


@pytest.mark.slow  # two Chromium launches: about 50 s on two loaded cores
@pytest.mark.skipif(CHROMIUM is None, reason="no Chromium on this machine (apt-get install "
                                              "chromium; .ci/run tries to)")
def test_pages_load_in_a_real_browser_with_data_in_every_plot(tmp_path):
    sp, cp = _pages(tmp_path)
    for path, least in ((sp, 6), (cp, 7)):
        got = _check_in_browser(path, tmp_path)
        assert got["errors"] == [], got
        assert got["plots"] >= least and got["with_data"] == got["plots"], got

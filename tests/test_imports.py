"""Import direction: moe_core never pulls in Ray, W&B or Optuna (STYLE.md)."""

import subprocess
import sys


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


def test_analysis_imports_neither_torch_nor_ray():
    code = (
        "import sys, analysis.fit, analysis.laws, analysis.derived, analysis.report, "
        "analysis.claims;"
        "bad=[m for m in ('torch','ray','wandb','deepspeed') if m in sys.modules];"
        "print(','.join(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"analysis imported {out.stdout.strip()}"

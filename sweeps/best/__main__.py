"""``python -m sweeps.best`` runs ``python -m analysis.best`` (the command's new name)."""

import runpy

runpy.run_module("analysis.best", run_name="__main__", alter_sys=True)

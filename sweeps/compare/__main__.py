"""``python -m sweeps.compare`` runs ``python -m analysis.compare`` (the command's new name)."""

import runpy

runpy.run_module("analysis.compare", run_name="__main__", alter_sys=True)

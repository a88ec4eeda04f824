"""``python -m sweeps.run SPEC``: :func:`sweeps.run.cli.main`."""

import os
import sys

from sweeps.run.cli import main

os.environ.setdefault("WANDB_MODE", "offline")
sys.exit(main())

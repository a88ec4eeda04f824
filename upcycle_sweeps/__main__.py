"""``python -m upcycle_sweeps``: the same as the installed ``upcycle-sweeps`` command."""

import sys

from upcycle_sweeps.cli import main

sys.exit(main())

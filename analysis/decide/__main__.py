"""``python -m analysis.decide``: the command line, :func:`analysis.cli.decide_main` (the library
itself, ``analysis.decide``, does not import the command lines, which import it)."""

import sys

from analysis.cli import decide_main

sys.exit(decide_main())

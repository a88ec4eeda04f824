"""``python -m analysis.fit``: the command line, :func:`analysis.cli.fit_main` (the library
itself, ``analysis.fit``, does not import the command lines, which import it)."""

import sys

from analysis.cli import fit_main

sys.exit(fit_main())

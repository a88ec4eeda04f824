"""``python -m analysis.derived``: the command line, :func:`analysis.cli.derived_main` (the library
itself, ``analysis.derived``, does not import the command lines, which import it)."""

import sys

from analysis.cli import derived_main

sys.exit(derived_main())

"""``python -m analysis.noise``: the command line, :func:`analysis.cli.noise_main` (the library
itself, ``analysis.noise``, does not import the command lines, which import it)."""

import sys

from analysis.cli import noise_main

sys.exit(noise_main())

"""``upcycle-sweeps``: one installed command for the project's command lines (``cli``)."""

"""analysis: fit the seeds' scaling laws to sweep results; derived decisions; reports.

Modules, lowest first (each imports only modules above it):

- ``laws``: the laws' registry and the ``Points`` they are fitted to;
- ``fit``: the fitter (Huber on ln L, leave-one-out, bootstrap); ``derived``: decisions the
  fitted laws imply (D*, compute-optimal upcycling, η, cost); both are packages whose
  ``__main__`` runs their command line from ``cli`` (which imports them, never the reverse);
- ``data``: reading results (through ``sweeps.store.results``, the column schema) and
``load_points``;
- ``sweep``: one sweep's results as typed groups (``Sweep``, ``Group``, ``Stat``);
- ``sections``: report sections as data; ``plots``: every figure; ``claims``: the seeds' claims
  a sweep tests, chosen by the knobs it varies;
- ``noise``: seed-to-seed noise of ln L and its share common to a stable run (``analysis.noise``);
- ``cli``: the ``analysis.fit`` and ``analysis.derived`` command lines and the error contract
  every analysis command line shares; ``report``: assembles a sweep's report.

Imports flow analysis → sweeps → moe_core; nothing here imports torch or Ray.
"""

"""sweeps: YAML search spaces → Ray Tune sweeps over moe_core training runs, in stages.

``spec`` (the YAML front door: the spec, its search space and expressions), ``plan`` (trials,
branch groups, cost, resources, the pre-flight check), ``run`` (the driver, a trial, parents,
the console, ``python -m sweeps.run``), ``store`` (the results sink and schema, storage,
signing, trust), ``law`` (``algorithm: law``), ``cluster`` (launch configs, the fake local
cluster) and ``testing`` (fault injection, simulated trials). docs/design.md maps every module.
"""

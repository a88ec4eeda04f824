"""analysis: fit the seeds' scaling laws to sweep results; derived decisions; reports.

Imports flow analysis → sweeps → moe_core; nothing here imports torch or Ray.
"""

"""Cluster launch configs (``aws.yaml``, ``gcp.yaml``, ``kuberay.yaml``) and a fake
multi-node autoscaling cluster on this machine (``python -m sweeps.cluster local up|down``,
``sweeps.cluster.local``). See docs/cluster.md."""

from moe_core.lazy import lazy_exports

__all__ = ["LocalCluster", "LocalClusterConfig"]
__getattr__, __dir__ = lazy_exports(__name__, {
    "LocalCluster": "sweeps.cluster.local", "LocalClusterConfig": "sweeps.cluster.local"})

"""Cluster launch configs (``aws.yaml``, ``gcp.yaml``, ``kuberay.yaml``) and a fake
multi-node autoscaling cluster on this machine (``python -m sweeps.cluster local up|down``,
``sweeps.cluster.local``). See docs/cluster.md."""

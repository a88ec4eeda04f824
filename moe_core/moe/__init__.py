"""The MoE layer and its routing/balancing/statistics math."""

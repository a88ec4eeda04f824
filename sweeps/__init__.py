"""sweeps: YAML search spaces → Ray Tune sweeps over moe_core training runs."""

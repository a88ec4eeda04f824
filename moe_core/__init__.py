"""moe_core: Llama-style decoder, MoE layers, upcycling operators and DeepSpeed training.

Ray and W&B never appear here. Heavy submodules (torch) load lazily so that
``import moe_core.errors`` stays cheap for the analysis package.
"""

from __future__ import annotations

from moe_core.lazy import lazy_exports

__all__ = [
    "ModelConfig",
    "MoEConfig",
    "RouterConfig",
    "build_model",
    "count_params",
    "model_config",
]

_LAZY = {
    "ModelConfig": "moe_core.config",
    "MoEConfig": "moe_core.config",
    "RouterConfig": "moe_core.config",
    "build_model": "moe_core.model",
    "count_params": "moe_core.params",
    "model_config": "moe_core.presets",
}


__getattr__, __dir__ = lazy_exports(__name__, _LAZY)

"""Size presets as data (000 Table 3 shapes, Table 5 init std, LR and batch), plus CPU presets."""

from __future__ import annotations

from dataclasses import dataclass

from moe_core.config import ModelConfig, MoEConfig
from moe_core.errors import ConfigError


@dataclass(frozen=True, slots=True)
class Preset:
    n_layer: int
    d_model: int
    n_head: int
    init_std: float
    warmup_steps: int
    max_steps: int
    batch_size: int
    lr_dense: float
    lr_moe: float


# 000 Table 3 (n_layer, d_model, n_head) and Table 5 (warmup, init size, max iter, batch, LR (8x)).
PRESETS: dict[str, Preset] = {
    "15M": Preset(9, 320, 4, 0.035, 200, 17_600, 128, 8e-3, 2e-3),
    "44M": Preset(12, 480, 8, 0.029, 200, 17_600, 256, 4e-3, 2e-3),
    "0.1B": Preset(15, 640, 8, 0.025, 200, 17_600, 512, 4e-3, 2e-3),
    "0.2B": Preset(21, 832, 8, 0.022, 400, 35_200, 512, 2e-3, 2e-3),
    "0.5B": Preset(26, 1120, 16, 0.019, 800, 70_400, 512, 4e-4, 4e-4),
    "1B": Preset(30, 1504, 16, 0.016, 800, 70_400, 1024, 4e-4, 4e-4),
    # CPU presets: train a few hundred steps in about a minute on 2 cores.
    "tiny": Preset(4, 128, 4, 0.04, 20, 400, 16, 3e-3, 2e-3),
    "debug": Preset(2, 64, 4, 0.05, 10, 200, 16, 5e-3, 3e-3),
}


def preset(name: str) -> Preset:
    try:
        return PRESETS[name]
    except KeyError:
        raise ConfigError(
            f"model.preset={name!r} is not known; choose one of {', '.join(PRESETS)}"
        ) from None


def model_config(
    name: str, *, vocab_size: int, moe: MoEConfig | None = None, max_seq_len: int = 1024
) -> ModelConfig:
    """The ``ModelConfig`` of a named size preset (d_ff = 4·d_model, 000 Table 3)."""
    p = preset(name)
    return ModelConfig(
        vocab_size=vocab_size,
        n_layer=p.n_layer,
        d_model=p.d_model,
        n_head=p.n_head,
        init_std=p.init_std,
        max_seq_len=max_seq_len,
        moe=moe,
        name=name,
    )

"""Expert parallelism through DeepSpeed-MoE's process groups.

Our own MoE layer keeps every router variant and the sort-based dispatch; for the DeepSpeed
engine to treat its experts as expert parameters (reduced over the expert-data-parallel group,
kept in their own optimizer groups), the layer must also be an instance of
``deepspeed.moe.layer.MoE``. ``DeepSpeedMoELayer`` adds exactly that: the marker base class, the
``allreduce=False`` / ``group_name`` tags on expert parameters, and ``set_deepspeed_parallelism``,
which creates (or reuses) DeepSpeed's ``ep_size_{n}`` groups and hands the expert-parallel group
to the layer's all-to-all.
"""

from __future__ import annotations

from typing import Any

from deepspeed.moe.layer import MoE as _DeepSpeedMoE
from deepspeed.utils import groups

from moe_core.config import MoEConfig
from moe_core.moe.layer import MoELayer


class DeepSpeedMoELayer(MoELayer, _DeepSpeedMoE):
    """:class:`MoELayer` recognised by the DeepSpeed engine as an MoE layer."""

    ep_size_default = 1

    def __init__(self, d_model: int, d_ff: int, cfg: MoEConfig, init_std: float):
        MoELayer.__init__(self, d_model, d_ff, cfg, init_std)
        self.planned_ep_size = type(self).ep_size_default
        self.expert_group_name = f"ep_size_{self.planned_ep_size}"
        self.enable_expert_tensor_parallelism = False
        self._tag_expert_params()

    def _tag_expert_params(self) -> None:
        for p in (self.w_gate, self.w_up, self.w_down):
            p.allreduce = False  # DeepSpeed's is_moe_param()
            p.group_name = self.expert_group_name

    def shard_experts(self, ep_rank: int, ep_size: int, group: Any = None) -> None:
        super().shard_experts(ep_rank, ep_size, group)
        self._tag_expert_params()

    def set_deepspeed_parallelism(self, use_data_before_expert_parallel_: bool = False) -> None:
        if self.expert_group_name not in groups._get_expert_parallel_group_dict():
            groups._create_expert_and_data_parallel(
                self.planned_ep_size,
                use_data_before_expert_parallel_=use_data_before_expert_parallel_,
            )
        if self.planned_ep_size > 1:
            self.ep_group = groups._get_expert_parallel_group(self.expert_group_name)


def deepspeed_moe_layer_cls(ep_size: int) -> type[DeepSpeedMoELayer]:
    """A DeepSpeedMoELayer class whose instances plan ``ep_size`` expert ranks."""
    return type(f"DeepSpeedMoELayer_ep{ep_size}", (DeepSpeedMoELayer,),
                {"ep_size_default": ep_size})


def expert_parallel_ranks(world_size: int, rank: int, ep_size: int) -> tuple[int, int]:
    """(ep_rank, ep_size) of ``rank`` with DeepSpeed's default layout (EP groups are
    consecutive ranks)."""
    return rank % ep_size, ep_size

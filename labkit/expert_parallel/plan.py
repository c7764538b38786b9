"""The expert-parallel plan: step 4 of ``labkit.parallelize``, applied to each model chunk.

Chapter "Expert parallelism". Like the tensor-parallel plan it swaps seams of the dense model by
name and tags parameters; the model's one forward is unchanged (labkit/moe.py). For every MoE layer
(``decoder.layers.i.mlp``) of the chunk:

    mlp.experts.local_experts.*   keep experts [ep_rank * E/ep, (ep_rank + 1) * E/ep), by number;
                                  with etp > 1 cut each one like TP: fc1 rows, fc2 columns
    mlp.experts (parameters)      tagged allreduce=False: reduced over the expert-data-parallel
                                  group, not dp x cp (data_parallel/wrap.py)
    mlp.router                    under SP: counts summed over tp (router.py), weight tagged
    mlp.router.aux_loss_scale     1 / num_microbatches (Megatron's MoEAuxLossAutoScaler scale)
    mlp.token_dispatcher          all-to-all or all-gather (dispatch.py) when ep or etp > 1

Megatron-LM builds the same from its expert RankGenerator: ``BaseMoELayer`` keeps
``num_moe_experts // ep_size`` experts starting at ``ep_rank * num_local_experts`` (moe_layer.py),
``TEGroupedMLP`` cuts them over the expert-tensor-parallel group (experts.py, d98e8a64).
"""
from __future__ import annotations

import torch.nn.functional as F
from torch import nn

from ..groups import Group
from ..moe import ExpertMLP, moe_layers
from ..param_attrs import tag
from .dispatch import AllGatherDispatcher, AllToAllDispatcher
from .router import SequenceParallelRouter


class ExpertRowParallelLinear(nn.Module):
    """An expert's fc2 cut over etp: weight columns [h, f/etp]. The bias is added by etp rank 0
    only, so the reduce-scatter over etp adds it once; its gradient (0 on the other etp ranks) is
    summed over the group like a sequence-parallel parameter's."""

    def __init__(self, linear: nn.Linear, etp: Group):
        super().__init__()
        cols = linear.in_features // etp.size
        w = linear.weight[:, etp.rank * cols:(etp.rank + 1) * cols]
        self.weight = nn.Parameter(w.detach().clone())
        self.bias = nn.Parameter(linear.bias.detach().clone())
        tag(self.weight, tensor_model_parallel=True, partition_dim=1)
        tag(self.bias, sequence_parallel=True)
        self.bias_scale = 1.0 if etp.rank == 0 else 0.0

    def forward(self, x):                                   # [n, f/etp] -> [n, h], a partial sum
        return F.linear(x, self.weight) + self.bias * self.bias_scale


def cut_expert(expert: ExpertMLP, etp: Group) -> None:
    """Keep this etp rank's slice of one expert, in place (fc1 rows, fc2 columns)."""
    fc1, rows = expert.linear_fc1, expert.linear_fc1.out_features // etp.size
    part = slice(etp.rank * rows, (etp.rank + 1) * rows)
    new = nn.Linear(fc1.in_features, rows, dtype=fc1.weight.dtype, device=fc1.weight.device)
    new.weight, new.bias = (nn.Parameter(fc1.weight[part].detach().clone()),
                            nn.Parameter(fc1.bias[part].detach().clone()))
    for p in (new.weight, new.bias):
        tag(p, tensor_model_parallel=True, partition_dim=0)
    expert.linear_fc1, expert.linear_fc2 = new, ExpertRowParallelLinear(expert.linear_fc2, etp)


def local_expert_ids(num_experts: int, ep_size: int, ep_rank: int) -> range:
    """The experts ep rank ``ep_rank`` holds: a contiguous block of num_experts / ep."""
    n = num_experts // ep_size
    return range(ep_rank * n, (ep_rank + 1) * n)


def apply_expert_parallel(model: nn.Module, groups: dict[str, Group], cfg, num_microbatches: int) -> nn.Module:
    """Cut every MoE layer of ``model`` (a GPT or a pipeline stage) for this rank, in place."""
    ep, etp = groups["ep"], groups["etp"]
    sp = cfg.sequence_parallel and groups["tp"].size > 1
    keep = local_expert_ids(cfg.num_experts, ep.size, ep.rank)
    for layer in moe_layers(model):
        experts = layer.experts.local_experts
        for key in list(experts):
            if int(key) not in keep:
                del experts[key]
        if etp.size > 1:
            for expert in experts.values():
                cut_expert(expert, etp)
        for p in experts.parameters():
            tag(p, allreduce=False)
        if sp:
            layer.router = SequenceParallelRouter.from_dense(layer.router, groups["tp"])
        layer.router.aux_loss_scale = 1.0 / num_microbatches
        if ep.size > 1 or etp.size > 1:
            layer.token_dispatcher = (
                AllToAllDispatcher(ep, etp, groups["etp_ep"], cfg.num_experts)
                if cfg.moe_token_dispatcher_type == "alltoall"
                else AllGatherDispatcher(ep, groups["etp_ep"], cfg.num_experts))
    return model


def describe(cfg, ep: int, etp: int = 1) -> dict[str, str]:
    """{module name pattern: what the plan does}: the plan as the book prints it."""
    n = cfg.num_experts // ep
    return {
        "decoder.layers.*.mlp.experts.local_experts.*": f"keep {n} of {cfg.num_experts} (E/ep)"
        + (f", each cut {etp} ways (fc1 rows, fc2 columns)" if etp > 1 else ""),
        "decoder.layers.*.mlp.experts (parameters)": "allreduce=False: reduced over expert-DP",
        "decoder.layers.*.mlp.router": "replicated; under SP counts summed over tp",
        "decoder.layers.*.mlp.token_dispatcher": f"{cfg.moe_token_dispatcher_type} over ep {ep}"
        if ep * etp > 1 else "local (all experts here)",
    }

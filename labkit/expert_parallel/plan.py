"""The expert-parallel plan: step 4 of ``labkit.parallelize``, applied to each model chunk.

Chapter "Expert parallelism". Like the tensor-parallel plan it swaps seams of the dense model by
name and tags parameters; the model's one forward is unchanged (labkit/moe.py). For every MoE layer
(``decoder.layers.i.mlp``) of the chunk:

    mlp.experts.local_experts.*   keep experts [ep_rank * E/ep, (ep_rank + 1) * E/ep), by number;
                                  with etp > 1 cut each one like TP: fc1 rows ([gate_r; up_r] for
                                  SwiGLU experts), fc2 columns
    mlp.experts (parameters)      in the shard plan: averaged over the expert-data-parallel group,
                                  not dp x cp, after a scale edp / (dp x cp) (Megatron's; tag
                                  allreduce=False)
    mlp.router                    replicated over tp; under SP counts summed over tp (router.py)
                                  and its gradient summed over tp
    mlp.router.aux_loss_scale     1 / num_microbatches (Megatron's MoEAuxLossAutoScaler scale)
    mlp.token_dispatcher          all-to-all or all-gather (dispatch.py) when ep or etp > 1

Megatron-LM builds the same from its expert RankGenerator: ``BaseMoELayer`` keeps
``num_moe_experts // ep_size`` experts starting at ``ep_rank * num_local_experts`` (moe_layer.py),
``TEGroupedMLP`` cuts them over the expert-tensor-parallel group (experts.py, d98e8a64).
"""
from __future__ import annotations

from torch import nn

from .. import shard_plan as sp_
from ..fp8.linear import fp8_or_linear
from ..groups import Group, grad_reduce_group
from ..modules import MLP, role
from ..moe import moe_layers
from ..param_attrs import tag
from .dispatch import AllGatherDispatcher, AllToAllDispatcher
from .router import SequenceParallelRouter


class ExpertRowParallelLinear(nn.Module):
    """An expert's fc2 cut over etp: weight columns [h, f/etp]. The bias is added by etp rank 0
    only, so the reduce-scatter over etp adds it once; its gradient (0 on the other etp ranks) is
    summed over the group (the shard plan says so)."""

    def __init__(self, weight, bias, etp: Group):
        super().__init__()
        self.weight = nn.Parameter(weight.detach().clone())
        self.bias = None if bias is None else nn.Parameter(bias.detach().clone())
        self.bias_scale = 1.0 if etp.rank == 0 else 0.0

    def forward(self, x):                                   # [n, f/etp] -> [n, h], a partial sum
        y = fp8_or_linear(self, x, self.weight)           # labkit.fp8's GEMMs when it gave some
        return y if self.bias is None else y + self.bias * self.bias_scale


def cut_expert(expert: MLP, etp: Group, entries: dict) -> dict:
    """Keep this etp rank's slice of one expert, in place: fc1 rows (for a SwiGLU expert the pair
    [gate_r; up_r]), fc2 columns. ``entries``: {"linear_fc1.weight": ParamShard, ...} of the
    expert; returns them refined."""
    t, r = etp.size, etp.rank
    fc1, fc2 = expert.linear_fc1, expert.linear_fc2
    rows = sp_.stacked(fc1.out_features, getattr(fc1, "stack", 1), t, r)
    out = {k: e.cut_along(0, rows, "etp") for k, e in entries.items() if k.startswith("linear_fc1.")}
    out["linear_fc2.weight"] = entries["linear_fc2.weight"].cut_along(1, sp_.contiguous(fc2.in_features, t, r), "etp")
    if fc2.bias is not None:
        out["linear_fc2.bias"] = entries["linear_fc2.bias"].with_replicas("etp", r, t, summed=True)
    new = role(nn.Linear(fc1.in_features, sum(b.size for b in rows), bias=fc1.bias is not None,
                         dtype=fc1.weight.dtype, device=fc1.weight.device), "expert_fc1", stack=getattr(fc1, "stack", 1))
    new.weight = nn.Parameter(sp_.cut(fc1.weight.detach(), out["linear_fc1.weight"]))
    if fc1.bias is not None:
        new.bias = nn.Parameter(sp_.cut(fc1.bias.detach(), out["linear_fc1.bias"]))
    expert.linear_fc1 = new
    expert.linear_fc2 = role(ExpertRowParallelLinear(sp_.cut(fc2.weight.detach(), out["linear_fc2.weight"]),
                                                     fc2.bias, etp), "expert_fc2")
    return out


def local_expert_ids(num_experts: int, ep_size: int, ep_rank: int) -> range:
    """The experts ep rank ``ep_rank`` holds: a contiguous block of num_experts / ep."""
    n = num_experts // ep_size
    return range(ep_rank * n, (ep_rank + 1) * n)


def apply_expert_parallel(model: nn.Module, groups: dict[str, Group], cfg, num_microbatches: int,
                          plan: sp_.ShardPlan | None = None) -> nn.Module:
    """Cut every MoE layer of ``model`` (a GPT or a pipeline stage) for this rank, in place,
    refining ``plan`` (made from ``model`` if None); Megatron's tags come from it."""
    plan = sp_.initial(model) if plan is None else plan
    ep, etp, tp, edp = groups["ep"], groups["etp"], groups["tp"], groups["edp"]
    sp = cfg.sequence_parallel and tp.size > 1
    keep = local_expert_ids(cfg.num_experts, ep.size, ep.rank)
    scale = edp.size / grad_reduce_group(groups).size       # Megatron's expert_gradient_scaling_factor
    prefix = {m: n + "." for n, m in model.named_modules()}
    for layer in moe_layers(model):
        experts = layer.experts.local_experts
        for key in list(experts):
            if int(key) not in keep:
                for n, _ in experts[key].named_parameters():
                    del plan[prefix[experts[key]] + n]
                del experts[key]
        for expert in experts.values():
            entries = {n: plan[prefix[expert] + n].with_(dp="edp", dp_index=edp.rank, grad_scale=scale,
                                                         expert=True) for n, _ in expert.named_parameters()}
            if etp.size > 1:
                entries = cut_expert(expert, etp, entries)
            plan.update({prefix[expert] + n: e for n, e in entries.items()})
        name = prefix[layer] + "router.weight"
        plan[name] = plan[name].with_replicas("tp", tp.rank, tp.size, summed=sp)
        if sp:
            layer.router = role(SequenceParallelRouter.from_dense(layer.router, tp), "router")
        layer.router.aux_loss_scale = 1.0 / num_microbatches
        if ep.size > 1 or etp.size > 1:
            layer.token_dispatcher = (
                AllToAllDispatcher(ep, etp, groups["etp_ep"], cfg.num_experts)
                if cfg.moe_token_dispatcher_type == "alltoall"
                else AllGatherDispatcher(ep, groups["etp_ep"], cfg.num_experts))
    for n, p in model.named_parameters():
        tag(p, **plan[n].tags())
    return model


def apply(chunks: list, groups: dict[str, Group], cfg, plan: sp_.ShardPlan, num_microbatches: int = 1):
    """Step 4 of ``labkit.parallelize``: every chunk's MoE layers for this rank; returns the plan."""
    for chunk in chunks:
        apply_expert_parallel(chunk, groups, cfg, num_microbatches, plan)
    return plan


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

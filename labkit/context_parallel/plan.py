"""The context-parallel plan: swap every layer's ``core_attention``, shard every microbatch.

Chapter "Context parallelism". Step 3 of ``labkit.parallelize`` (after the pipeline split and TP):
everything in a transformer layer but attention works token by token, so it runs unchanged on the
rank's s/c tokens; only the core attention (q, k, v [b, n, s/c, d] -> [b, n, s/c, d]) needs the
other ranks' keys and values, and becomes :class:`ContextParallelAttention` (found by its role,
"core_attention"). The batch is cut by the Engine's batch transform (``sharding``): tokens,
labels and the GLOBAL position ids of the rank's two chunks, which the learned position table and
RoPE read (RoPE rotates q and k before the core attention, so K/V blocks travel already rotated).
With group-query attention K/V carry the g query groups, not the n heads (``blockwise``). No
parameter is cut: in the shard plan CP only widens the data-parallel group of every dense
parameter to dp x cp (``groups.grad_reduce_group``); the loss of each rank is the mean over its
s/c tokens, so the average over dp x cp is the full mean.

    plan = apply(chunks, groups, cfg, plan)                 # labkit.parallelize, step 3
    Engine(..., batch_transform=batch_transform(groups["cp"].rank, cp))
"""
from __future__ import annotations

from torch import nn

from ..groups import Group
from .a2a_attention import a2a_attention
from .allgather_attention import allgather_attention
from .blockwise import Work
from .ring_attention import ring_attention
from .sharding import LAYOUTS, batch_transform

# Megatron's values (TransformerConfig.cp_comm_type); "allgather" is how --cp-comm-type's help spells it
CP_COMM_TYPES = {"p2p": ring_attention, "all_gather": allgather_attention, "allgather": allgather_attention,
                 "a2a": a2a_attention}
CORE_ATTENTION = "decoder.layers.*.self_attention.core_attention"


class ContextParallelAttention(nn.Module):
    """Causal attention over the whole sequence for this rank's tokens; ``work`` adds up what
    this rank computed (blockwise variants)."""

    def __init__(self, group: Group, cp_comm_type: str = "p2p", layout: str = "balanced",
                 causal: bool = True):
        super().__init__()
        if cp_comm_type not in CP_COMM_TYPES:
            raise ValueError(f"cp_comm_type must be one of {sorted(CP_COMM_TYPES)}, got {cp_comm_type!r}")
        if layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
        self.group, self.cp_comm_type, self.layout, self.causal = group, cp_comm_type, layout, causal
        self.work = Work()

    def forward(self, q, k, v):                             # [b, n, s/c, d] each
        attn = CP_COMM_TYPES[self.cp_comm_type]
        return attn(self.group, q, k, v, self.layout, self.causal, self.work)

    def extra_repr(self) -> str:
        return f"cp={self.group.size}, cp_comm_type={self.cp_comm_type!r}, layout={self.layout!r}"


def _swap(model: nn.Module, group: Group, cp_comm_type: str, layout: str) -> int:
    """Replace every module of role "core_attention" (labkit's causal attention; attention dropout
    is refused by the rule book, labkit/config.py)."""
    n = 0
    for name, module in list(model.named_modules()):
        if getattr(module, "role", None) == "core_attention":
            parent, _, child = name.rpartition(".")
            new = ContextParallelAttention(group, cp_comm_type, layout)
            new.role = "core_attention"
            setattr(model.get_submodule(parent) if parent else model, child, new)
            n += 1
    return n


def apply(chunks: list, groups: dict[str, Group], cfg, plan):
    """Step 3 of ``labkit.parallelize``: swap every chunk's core attentions; returns ``plan``
    (unchanged: its dense entries are already averaged over dp x cp, ``shard_plan.initial``)."""
    for chunk in chunks:
        _swap(chunk, groups["cp"], cfg.cp_comm_type, "balanced")
    return plan


def apply_context_parallel(model: nn.Module, group: Group, cp_comm_type: str = "p2p",
                           layout: str = "balanced", pattern: str = CORE_ATTENTION):
    """Swap the core attention of every layer of ``model`` (a GPT, a pipeline stage of one, or a
    layer), in place; returns the batch transform (tokens, labels) -> (tokens, labels,
    position_ids) of this CP rank. ``pattern`` is kept for old callers: the role finds them."""
    _swap(model, group, cp_comm_type, layout)
    return batch_transform(group.rank, group.size, layout)


def describe(cp_comm_type: str = "p2p") -> dict[str, str]:
    """{module pattern or step: what happens}: the plan as the book prints it."""
    comm = {"p2p": "K/V blocks round the ring (send/recv), online-softmax merge",
            "all_gather": "all-gather K/V, attend; backward reduce-scatters dK/dV",
            "a2a": "all-to-all to heads/c x full sequence, attend, all-to-all back"}[cp_comm_type]
    return {"batch (Engine.batch_transform)": "tokens, labels, position_ids: chunks r and 2c-1-r",
            CORE_ATTENTION: comm,
            "every other module": "unchanged: runs on the rank's s/c tokens",
            "gradients": "partial over cp: averaged over dp x cp (DP wrap)"}

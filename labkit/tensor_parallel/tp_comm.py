"""The conjugate operators at the borders of a tensor-parallel region (Megatron's mappings.py).

Chapters "Tensor parallelism" (Shoeybi et al. 2019, Sec. 3: the f and g operators) and "Sequence
parallelism" (Korthikanti et al. 2022, Sec. 4.2.2: g and its conjugate g-bar). The backward of each
operator is the conjugate (transpose) of its forward. Names are Megatron-LM's
(``megatron/core/tensor_parallel/mappings.py``); the paper names are in brackets.

| function                    | forward              | backward             | dim      | where                       |
|-----------------------------|----------------------|----------------------|----------|-----------------------------|
| copy_to          (f)        | identity             | all-reduce           | -        | before linear_qkv/fc1 (TP)  |
| reduce_from      (f-bar)    | all-reduce           | identity             | -        | after linear_proj/fc2 (TP)  |
| gather_from_sequence (g)    | all-gather           | reduce-scatter       | seq (1)  | leaving the SP region: before linear_qkv/fc1 |
| reduce_scatter_to_sequence (g-bar) | reduce-scatter | all-gather         | seq (1)  | entering the SP region: after linear_proj/fc2 |
| scatter_to_sequence         | keep my chunk        | all-gather           | seq (1)  | embedding -> SP region      |
| scatter_to / gather_from    | keep my chunk / all-gather | all-gather / keep | any (-1) | gathered outputs          |

Shoeybi et al. call the TP pair f and g; Korthikanti et al. rename them f / f-bar and call the
sequence-parallel pair g (all-gather forward, reduce-scatter backward) / g-bar (its conjugate).
Every op is counted on the group's stats by labkit.comm.
"""
from __future__ import annotations

import torch

from .. import comm
from ..groups import Group

SEQ_DIM = 1  # activations are [b, s, h]: the sequence is dim 1


def _chunk(group: Group, x: torch.Tensor, dim: int) -> torch.Tensor:
    if x.shape[dim] % group.size:
        raise ValueError(f"size {x.shape[dim]} of dim {dim} not divisible by group size {group.size}")
    return x.chunk(group.size, dim=dim)[group.rank].contiguous()


class _CopyTo(torch.autograd.Function):
    """f: forward identity, backward all-reduce (the input was used by every rank)."""
    @staticmethod
    def forward(ctx, group, x):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return None, comm.all_reduce(ctx.group, g)


class _ReduceFrom(torch.autograd.Function):
    """f-bar: forward all-reduce of partial sums, backward identity (the gradient is replicated)."""
    @staticmethod
    def forward(ctx, group, x):
        return comm.all_reduce(group, x)

    @staticmethod
    def backward(ctx, g):
        return None, g


class _ScatterTo(torch.autograd.Function):
    """Forward: keep my chunk along dim; backward: all-gather along dim."""
    @staticmethod
    def forward(ctx, group, x, dim):
        ctx.group, ctx.dim = group, dim
        return _chunk(group, x, dim)

    @staticmethod
    def backward(ctx, g):
        return None, comm.all_gather(ctx.group, g, ctx.dim), None


class _GatherFrom(torch.autograd.Function):
    """Forward: all-gather along dim; backward: keep my chunk."""
    @staticmethod
    def forward(ctx, group, x, dim):
        ctx.group, ctx.dim = group, dim
        return comm.all_gather(group, x, dim)

    @staticmethod
    def backward(ctx, g):
        return None, _chunk(ctx.group, g, ctx.dim), None


class _GatherFromSequence(torch.autograd.Function):
    """g: forward all-gather of the sequence shards, backward reduce-scatter (sums partial grads)."""
    @staticmethod
    def forward(ctx, group, x, dim):
        ctx.group, ctx.dim = group, dim
        return comm.all_gather(group, x, dim)

    @staticmethod
    def backward(ctx, g):
        return None, comm.reduce_scatter(ctx.group, g, ctx.dim), None


class _ReduceScatterToSequence(torch.autograd.Function):
    """g-bar: forward reduce-scatter of partial sums into sequence shards, backward all-gather."""
    @staticmethod
    def forward(ctx, group, x, dim):
        ctx.group, ctx.dim = group, dim
        return comm.reduce_scatter(group, x, dim)

    @staticmethod
    def backward(ctx, g):
        return None, comm.all_gather(ctx.group, g, ctx.dim), None


def copy_to(group: Group, x):
    return _CopyTo.apply(group, x) if group.size > 1 else x


def reduce_from(group: Group, x):
    return _ReduceFrom.apply(group, x) if group.size > 1 else x


def scatter_to(group: Group, x, dim: int = -1):
    return _ScatterTo.apply(group, x, dim) if group.size > 1 else x


def gather_from(group: Group, x, dim: int = -1):
    return _GatherFrom.apply(group, x, dim) if group.size > 1 else x


def scatter_to_sequence(group: Group, x, dim: int = SEQ_DIM):
    return _ScatterTo.apply(group, x, dim) if group.size > 1 else x


def gather_from_sequence(group: Group, x, dim: int = SEQ_DIM):
    return _GatherFromSequence.apply(group, x, dim) if group.size > 1 else x


def reduce_scatter_to_sequence(group: Group, x, dim: int = SEQ_DIM):
    return _ReduceScatterToSequence.apply(group, x, dim) if group.size > 1 else x

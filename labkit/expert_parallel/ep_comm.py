"""The expert-parallel communication pairs (chapter "Expert parallelism"), as autograd Functions.

| function             | forward                              | backward                              | dim |
|----------------------|--------------------------------------|---------------------------------------|-----|
| all_to_all_autograd  | all-to-all with (out, in) splits     | all-to-all with the splits swapped    | 0   |
| gather_v             | all-gather of sizes[r] rows per rank | reduce-scatter-v: sum my rows' grads  | 0   |
| reduce_scatter_v     | sum, keep my sizes[me] rows          | gather_v of the gradients             | 0   |

Rank r sends rows ``input_split_sizes[j]`` to rank j; the backward sends each gradient row back
to where its row came from (Megatron-LM ``tensor_parallel/mappings.py`` ``_AllToAll``). The "-v"
pair (rows of different counts per rank, Megatron's ``gather_from_sequence_parallel_region`` /
``reduce_scatter_to_sequence_parallel_region`` with ``output_split_sizes``) pads every rank's rows
to the largest count, because gloo's all-gather needs equal shapes; the counters then count the
padded bytes (equal counts, as in the all-gather dispatcher, pad nothing).
"""
from __future__ import annotations

import torch

from .. import comm
from ..groups import Group


class _AllToAll(torch.autograd.Function):
    """Forward all-to-all with (out, in) splits; backward the same exchange with splits swapped."""
    @staticmethod
    def forward(ctx, group, x, output_split_sizes, input_split_sizes):
        ctx.group, ctx.splits = group, (output_split_sizes, input_split_sizes)
        return comm.all_to_all(group, x, output_split_sizes, input_split_sizes)

    @staticmethod
    def backward(ctx, g):
        out_s, in_s = ctx.splits
        return None, comm.all_to_all(ctx.group, g.contiguous(), in_s, out_s), None, None


def all_to_all_autograd(group: Group, x, output_split_sizes=None, input_split_sizes=None):
    if group.size == 1:
        return x
    return _AllToAll.apply(group, x, output_split_sizes, input_split_sizes)


def _padded(x, rows: int):
    return torch.cat([x, x.new_zeros(rows - x.shape[0], *x.shape[1:])]) if x.shape[0] < rows else x


def _gather_v(group: Group, x, sizes: list[int]):
    """[sizes[me], ...] on each rank -> [sum(sizes), ...] in rank order."""
    most = max(sizes)
    if most == 0:
        return x.new_zeros(0, *x.shape[1:])
    parts = comm.all_gather(group, _padded(x, most)).split(most)
    return torch.cat([p[:n] for p, n in zip(parts, sizes)])


def _reduce_scatter_v(group: Group, x, sizes: list[int]):
    """[sum(sizes), ...] partial sums on each rank -> this rank's [sizes[me], ...], summed."""
    most = max(sizes)
    if most == 0:
        return x.new_zeros(0, *x.shape[1:])
    padded = torch.cat([_padded(c, most) for c in x.split(sizes)])
    return comm.reduce_scatter(group, padded)[:sizes[group.rank]]


class _GatherV(torch.autograd.Function):
    @staticmethod
    def forward(ctx, group, x, sizes):
        ctx.group, ctx.sizes = group, sizes
        return _gather_v(group, x, sizes)

    @staticmethod
    def backward(ctx, g):
        return None, _reduce_scatter_v(ctx.group, g.contiguous(), ctx.sizes), None


class _ReduceScatterV(torch.autograd.Function):
    @staticmethod
    def forward(ctx, group, x, sizes):
        ctx.group, ctx.sizes = group, sizes
        return _reduce_scatter_v(group, x, sizes)

    @staticmethod
    def backward(ctx, g):
        return None, _gather_v(ctx.group, g.contiguous(), ctx.sizes), None


def gather_v(group: Group, x, sizes: list[int]):
    """All-gather rows along dim 0, ``sizes[r]`` rows from group rank r (autograd: reduce-scatter-v)."""
    return x if group.size == 1 else _GatherV.apply(group, x, [int(n) for n in sizes])


def reduce_scatter_v(group: Group, x, sizes: list[int]):
    """Sum over the group, keep this rank's ``sizes[me]`` rows (autograd: gather_v)."""
    return x if group.size == 1 else _ReduceScatterV.apply(group, x, [int(n) for n in sizes])

"""The all-to-all as an autograd pair: expert dispatch and combine (chapter "Expert parallelism").

| function             | forward                         | backward                          | dim |
|----------------------|---------------------------------|-----------------------------------|-----|
| all_to_all_autograd  | all-to-all with (out, in) splits | all-to-all with the splits swapped | 0  |

Rank r sends rows ``input_split_sizes[j]`` to rank j; the backward sends each gradient row back
to where its row came from (Megatron-LM ``tensor_parallel/mappings.py`` ``_AllToAll``).
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

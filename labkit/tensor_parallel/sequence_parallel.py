"""Sequence parallelism (Megatron's, Korthikanti et al. 2022, Sec. 4.2.2): what TP leaves replicated,
cut along the sequence.

Chapter "Sequence parallelism". Under plain TP the layer norms, dropouts and residual adds run on
the full, replicated [b, s, h] activations on all t ranks: t copies of the same memory and work.
With ``sequence_parallel=True`` they run on [b, s/t, h] sequence shards. The TP all-reduce
(= reduce-scatter + all-gather) is split in its two halves: the all-gather g leaves the
sequence-parallel region (before linear_qkv and linear_fc1), the reduce-scatter g-bar enters it again
(after linear_proj and linear_fc2). Nothing is moved to the CPU: the saving is that no rank keeps the
others' shards. The operators are in ``tp_comm.py``; the plan that places them, and says which
replicated gradients are partial sums over tp under SP (the norms, row-parallel biases), in ``plan.py``.

This module holds what is specific to SP:
* :func:`sequence_range` - which positions a tp rank holds;
* :class:`ScatterToSequence` - the embedding's seam: after the word and position embeddings are
  summed (all-reduced over tp, replicated), keep this rank's positions. This is Megatron's path for
  learned absolute positions (``LanguageModelEmbedding``: all-reduce, add positions, then
  ``scatter_to_sequence_parallel_region``);
* advanced: :func:`use_regather` - Megatron's memory-saving column-parallel GEMM, which keeps the
  input shard and all-gathers it again in the backward (its own parity test).
"""
from __future__ import annotations

import torch
from torch import nn

from .. import comm
from ..groups import Group
from .tp_comm import scatter_to_sequence


def sequence_range(seq_length: int, rank: int, tp: int) -> tuple[int, int]:
    """[start, end) of the positions tp rank ``rank`` holds under sequence parallelism."""
    if seq_length % tp:
        raise ValueError(f"seq_length {seq_length} is not divisible by tensor_model_parallel_size {tp}: "
                         f"sequence parallelism gives each TP rank s/t positions")
    per = seq_length // tp
    return rank * per, (rank + 1) * per


class ScatterToSequence(nn.Module):
    """[b, s, h] replicated -> [b, s/t, h], this rank's positions; backward all-gathers."""

    def __init__(self, group: Group):
        super().__init__()
        self.group = group

    def forward(self, x):
        return scatter_to_sequence(self.group, x)


# ---------------------------------------------------------------------------------------------
# Advanced variant: Megatron's memory-saving column-parallel GEMM under SP
# ---------------------------------------------------------------------------------------------
class _GatherLinearRegather(torch.autograd.Function):
    """y = all_gather_seq(x) W^T + b, saving the [b, s/t, in] SHARD x instead of the gathered input;
    the backward all-gathers x again for the weight gradient (Megatron-LM's
    ``LinearWithGradAccumulationAndAsyncCommunication`` with sequence_parallel, minus its overlap)."""

    @staticmethod
    def forward(ctx, group, x, weight, bias):               # x [b, s/t, in], weight [out/t, in]
        ctx.group, ctx.has_bias = group, bias is not None
        ctx.save_for_backward(x, weight)
        total = comm.all_gather(group, x, dim=1)            # [b, s, in], freed after the GEMM
        return torch.nn.functional.linear(total, weight, bias)

    @staticmethod
    def backward(ctx, grad_out):                            # [b, s, out/t]
        x, weight = ctx.saved_tensors
        total = comm.all_gather(ctx.group, x, dim=1)        # the extra all-gather: memory for bytes
        grad_total = grad_out @ weight                      # [b, s, in]: partial over tp ranks
        grad_x = comm.reduce_scatter(ctx.group, grad_total, dim=1)  # sum, keep my positions
        grad_w = grad_out.flatten(0, 1).t() @ total.flatten(0, 1)   # [out/t, in]
        grad_b = grad_out.sum(dim=(0, 1)) if ctx.has_bias else None
        return None, grad_x, grad_w, grad_b


def linear_with_sequence_regather(group, x, weight, bias=None):
    """Column-parallel GEMM on a sequence shard that keeps only the shard for the backward."""
    return _GatherLinearRegather.apply(group, x, weight, bias)


def use_regather(module: nn.Module) -> nn.Module:
    """Advanced: switch every sequence-parallel ``ColumnParallelLinear`` in ``module`` to
    :func:`linear_with_sequence_regather`. Each such GEMM then keeps s*b*in/t instead of s*b*in
    input elements (per layer: linear_qkv and linear_fc1, 2*s*b*h*(1-1/t) elements less) and
    all-gathers its input once more in the backward. Returns ``module``."""
    for m in module.modules():
        if hasattr(m, "regather_input") and getattr(m, "sequence_parallel", False):
            m.regather_input = True     # a ColumnParallelLinear under SP
    return module

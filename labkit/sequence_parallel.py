"""Sequence parallelism (Megatron's, Korthikanti et al. 2022, Sec. 4.2.2): what TP leaves replicated,
cut along the sequence.

Chapter "Sequence parallelism". Under plain TP the layer norms, dropouts and residual adds run on
the full, replicated [b, s, h] activations on all t ranks: t copies of the same memory and work.
With ``sequence_parallel=True`` they run on [b, s/t, h] sequence shards. The TP all-reduce
(= reduce-scatter + all-gather) is split in its two halves: a reduce-scatter along the sequence
leaves each TP region (after linear_proj and linear_fc2), an all-gather along the sequence enters
the next one (before linear_qkv and linear_fc1). Same bytes, same GEMMs, 1/t of the activations
outside the TP regions. Nothing is moved to the CPU: the saving is that no rank keeps the others'
shards. (The pieces are ``labkit.comm.gather_from_sequence`` / ``reduce_scatter_to_sequence``, used
by labkit/tensor_parallel.py when ``sequence_parallel=True``.)

This module holds what is specific to SP:
* :func:`sequence_range` - which positions a tp rank holds;
* :func:`mark_sequence_parallel` - flag the replicated parameters fed sequence shards (layer norms),
  whose partial gradients the Engine sums over tp (``finalize_model_grads``);
* :func:`saved_activations` - measure what autograd keeps for the backward (unique storages), and
  :func:`labkit_layer_activation_bytes` - the same count, itemized, for labkit's transformer layer,
  to set next to Korthikanti's formula (``labkit.calc.memory.activation_bytes_per_layer``);
* advanced: :func:`use_regather` - Megatron's memory-saving column-parallel GEMM, which keeps the
  input shard and all-gathers it again in the backward (its own parity test).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn


def sequence_range(seq_length: int, rank: int, tp: int) -> tuple[int, int]:
    """[start, end) of the positions tp rank ``rank`` holds under sequence parallelism."""
    if seq_length % tp:
        raise ValueError(f"seq_length {seq_length} is not divisible by tensor_model_parallel_size {tp}: "
                         f"sequence parallelism gives each TP rank s/t positions")
    per = seq_length // tp
    return rank * per, (rank + 1) * per


def mark_sequence_parallel(module: nn.Module) -> None:
    """Set ``sequence_parallel = True`` on the parameters of every LayerNorm in ``module``."""
    for m in module.modules():
        if isinstance(m, nn.LayerNorm):
            for p in m.parameters(recurse=False):
                p.sequence_parallel = True


# ---------------------------------------------------------------------------------------------
@dataclass
class SavedActivations:
    """Tensors autograd saved for the backward during one forward, one entry per storage."""

    storages: dict = field(default_factory=dict)   # data_ptr -> (nbytes, shape of the first saver)

    @property
    def total_bytes(self) -> int:
        return sum(n for n, _ in self.storages.values())

    def table(self) -> list[tuple[int, tuple]]:
        """[(nbytes, shape)], largest first: what holds the memory."""
        return sorted(self.storages.values(), key=lambda r: -r[0])


def saved_activations(fn, *args, exclude=()) -> tuple[SavedActivations, object]:
    """Run ``fn(*args)`` and record every storage autograd saves (``saved_tensors_hooks``).

    Storages are counted once each, whole (a view saved by several ops counts once), parameters
    (``exclude``) not at all. Returns (SavedActivations, fn's output); the output keeps the graph
    alive, so the counted storages are still held when this returns.
    """
    skip = {p.untyped_storage().data_ptr() for p in exclude}
    rec = SavedActivations()

    def pack(t):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in skip and ptr not in rec.storages:
            rec.storages[ptr] = (t.untyped_storage().nbytes(), tuple(t.shape))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn(*args)
    return rec, out


def labkit_layer_activation_bytes(seq_length, micro_batch_size, hidden_size, num_attention_heads,
                                  tp=1, sequence_parallel=False, bytes_per_element=4,
                                  regather=False) -> dict:
    """What labkit's TransformerLayer saves on one TP rank, itemized (dropout 0, ffn = 4h).

    Korthikanti et al. 2022 count the same tensors in 16-bit plus the dropout masks and outputs;
    the differences are the subject of the chapter's table. Under SP, labkit keeps the all-gathered
    [b, s, h] inputs of linear_qkv and linear_fc1 (autograd saves the gathered tensor); Megatron
    keeps the [b, s/t, h] shard and all-gathers it again in the backward (``regather=True``: labkit's
    advanced variant, :func:`use_regather`).
    """
    s, b, h, a, t, e = seq_length, micro_batch_size, hidden_size, num_attention_heads, tp, bytes_per_element
    sp = sequence_parallel and t > 1
    sbh, shard = s * b * h, (t if sp else 1)
    return {
        "layer norm inputs (2)": 2 * sbh * e / shard,
        "layer norm mean and rstd (2 x 2)": 4 * s * b * e / shard,
        "linear_qkv and linear_fc1 inputs": 2 * sbh * e / (t if sp and regather else 1),  # gathered
        "Q, K, V": 3 * sbh * e / t,
        "softmax output": b * a * s * s * e / t,
        "causal mask (bool)": s * s,
        "linear_proj input": sbh * e / t,
        "GeLU input": 4 * sbh * e / t,
        "linear_fc2 input": 4 * sbh * e / t,
    }


def korthikanti_gaps(seq_length, micro_batch_size, hidden_size, num_attention_heads, tp=1,
                     sequence_parallel=False, regather=False) -> dict:
    """Bytes (16-bit accounting) to ADD to labkit's count to get Korthikanti et al.'s per-layer count.

    ``labkit_layer_activation_bytes(..., bytes_per_element=2) + sum(gaps) ==
    labkit.calc.memory.activation_bytes_per_layer(...)`` exactly; each entry is one reason.
    """
    s, b, h, a, t = seq_length, micro_batch_size, hidden_size, num_attention_heads, tp
    sp = sequence_parallel and t > 1
    sbh, shard = s * b * h, (t if sp else 1)
    gaps = {
        "dropout masks after attention and MLP (1 byte; labkit: dropout 0)": 2 * sbh / shard,
        "attention dropout mask (1 byte; labkit: dropout 0)": a * s * s * b / t,
        "attention dropout output (labkit: dropout 0, softmax output used directly)": 2 * a * s * s * b / t,
        "layer norm mean and rstd (labkit counts them; the paper does not)": -4 * s * b * 2 / shard,
        "causal mask (labkit builds it per call; the paper does not count it)": -s * s,
    }
    if sp and not regather:
        gaps["linear_qkv/linear_fc1 inputs: labkit keeps them gathered, Megatron re-gathers"] = \
            -2 * sbh * 2 * (1 - 1 / t)
    return gaps


# ---------------------------------------------------------------------------------------------
# Advanced variant: Megatron's memory-saving column-parallel GEMM under SP
# ---------------------------------------------------------------------------------------------
class _GatherLinearRegather(torch.autograd.Function):
    """y = all_gather_seq(x) W^T + b, saving the [b, s/t, in] SHARD x instead of the gathered input;
    the backward all-gathers x again for the weight gradient (Megatron-LM's
    ``LinearWithGradAccumulationAndAsyncCommunication`` with sequence_parallel, minus its overlap)."""

    @staticmethod
    def forward(ctx, group, x, weight, bias):               # x [b, s/t, in], weight [out/t, in]
        from . import comm
        ctx.group, ctx.has_bias = group, bias is not None
        ctx.save_for_backward(x, weight)
        total = comm.all_gather(group, x, dim=1)            # [b, s, in], freed after the GEMM
        return torch.nn.functional.linear(total, weight, bias)

    @staticmethod
    def backward(ctx, grad_out):                            # [b, s, out/t]
        from . import comm
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
    """Advanced: switch every sequence-parallel ColumnParallelLinear in ``module`` to
    :func:`linear_with_sequence_regather` (2*s*b*h*(1-1/t) bytes less per layer, one more
    all-gather per GEMM in the backward). Returns ``module``."""
    from .tensor_parallel import ColumnParallelLinear
    for m in module.modules():
        if isinstance(m, ColumnParallelLinear) and m.sequence_parallel:
            m.regather_input = True
    return module

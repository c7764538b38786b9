"""Column- and row-parallel linear layers: every GEMM's weight cut across the t ranks of the tp group.

Chapter "Tensor parallelism" (Shoeybi et al. 2019, "Megatron-LM", Sec. 3 and Fig. 3; Megatron-LM
``megatron/core/tensor_parallel/layers.py``) and chapter "Sequence parallelism".

MLP: Y = GeLU(X A) B.  A [h, 4h] is split by COLUMNS (rank r holds A_r [h, 4h/t]), so GeLU(X A_r)
is computed locally: no communication between the two GEMMs. B [4h, h] is split by ROWS (B_r
[4h/t, h]), so GeLU(X A_r) B_r is a partial sum and one all-reduce finishes it. Attention is the
same with heads: linear_qkv column-parallel (whole heads per rank), linear_proj row-parallel.
(torch stores a Linear's weight as [out, in], so "columns of A" are rows of the stored weight.)

At the borders (tensor_parallel/tp_comm.py): f before the column-parallel GEMM, f-bar after the
row-parallel one; under sequence parallelism the activations outside are [b, s/t, h] and the pair
becomes g (all-gather) / g-bar (reduce-scatter). Every layer is built ``from_dense(linear, group)``,
keeping this rank's slice of the dense weights: a contiguous 1/t by default, or the blocks of the
parameter's shard-plan entry (``labkit.shard_plan``: SwiGLU's [gate_r; up_r], a GQA rank's query
heads and its group's K/V). The plan, not the layer, says how each parameter's gradient is
finished and sets Megatron's tags.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .. import shard_plan
from ..groups import Group
from . import tp_comm
from .sequence_parallel import linear_with_sequence_regather


def _linear(module, x, w, b=None):
    """F.linear, or the layer's FP8 GEMMs when labkit.fp8 gave it quantizers (``module.fp8``)."""
    fp8 = getattr(module, "fp8", None)
    return F.linear(x, w, b) if fp8 is None else fp8.linear(x, w, b)


def divide(n: int, t: int, what: str) -> int:
    if n % t:
        raise ValueError(f"{what} {n} is not divisible by tensor_model_parallel_size {t}")
    return n // t


def _param(t: torch.Tensor | None) -> nn.Parameter | None:
    """A new parameter holding ``t`` (this rank's slice of a dense tensor)."""
    return None if t is None else nn.Parameter(t.detach().clone())


def _slice(t, entry, dim: int, group: Group, what: str):
    """This rank's part of the dense ``t``: ``entry``'s blocks, or a contiguous 1/t along ``dim``."""
    if t is None:
        return None
    if entry is not None:
        return shard_plan.cut(t, entry)
    n = divide(t.shape[dim], group.size, what)
    return t.narrow(dim, group.rank * n, n)


class ColumnParallelLinear(nn.Module):
    """Y_r = X A_r + b_r: rank r holds rows [r*out/t, (r+1)*out/t) of the dense weight [out, in].

    Input replicated [b, s, in] (or [b, s/t, in] under SP: all-gathered first); output
    [b, s, out/t], or gathered to [b, s, out] with ``gather_output``. ``weight`` may be None (the
    tied output layer): the caller then passes it to forward, as Megatron's output layer does.
    """

    regather_input = False  # advanced (sequence_parallel.use_regather): Megatron's memory saving

    def __init__(self, weight, bias, group: Group, gather_output=False, sequence_parallel=False):
        super().__init__()
        self.group, self.gather_output, self.sequence_parallel = group, gather_output, sequence_parallel
        self.weight = _param(weight)                        # [out/t, in]
        self.bias = _param(bias)                            # [out/t]

    @classmethod
    def from_dense(cls, linear: nn.Module, group: Group, entry=None, **kw):
        """``entry``: the weight's ParamShard (its rows; the bias takes the same), else 1/t contiguous."""
        w, bias = linear.weight, getattr(linear, "bias", None)
        if w is None:                                       # tied output layer: no weight here
            return cls(None, None, group, **kw)
        return cls(_slice(w, entry, 0, group, "output features"),        # bias: the same rows
                   _slice(bias, entry, 0, group, "output features"), group, **kw)

    def forward(self, x, weight=None):
        w = self.weight if weight is None else weight
        if self.sequence_parallel and self.regather_input:
            y = linear_with_sequence_regather(self.group, x, w, self.bias)
        else:
            x = (tp_comm.gather_from_sequence(self.group, x) if self.sequence_parallel   # g
                 else tp_comm.copy_to(self.group, x))                                     # f
            y = _linear(self, x, w, self.bias)              # [b, s, out/t]: no communication
        return tp_comm.gather_from(self.group, y, -1) if self.gather_output else y


class RowParallelLinear(nn.Module):
    """Y = sum_r X_r B_r + b: rank r holds columns [r*in/t, (r+1)*in/t) of the dense weight [out, in].

    Input [b, s, in/t] (the output of a ColumnParallelLinear); output replicated [b, s, out], or
    [b, s/t, out] under SP. The bias is added once, after the sum: it is replicated over tp, and
    under SP each rank adds it to its own positions only (a partial gradient, summed over tp).
    """

    def __init__(self, weight, bias, group: Group, sequence_parallel=False):
        super().__init__()
        self.group, self.sequence_parallel = group, sequence_parallel
        self.weight = _param(weight)                        # [out, in/t]
        self.bias = _param(bias)                            # [out], replicated

    @classmethod
    def from_dense(cls, linear: nn.Linear, group: Group, entry=None, **kw):
        """``entry``: the weight's ParamShard (its columns), else 1/t contiguous."""
        return cls(_slice(linear.weight, entry, 1, group, "input features"), linear.bias, group, **kw)

    def forward(self, x):                                  # x: [b, s, in/t]
        partial = _linear(self, x, self.weight)            # [b, s, out]: this rank's share of the sum
        if self.sequence_parallel:
            y = tp_comm.reduce_scatter_to_sequence(self.group, partial)  # g-bar: [b, s/t, out]
        else:
            y = tp_comm.reduce_from(self.group, partial)                  # f-bar: all-reduce
        return y if self.bias is None else y + self.bias

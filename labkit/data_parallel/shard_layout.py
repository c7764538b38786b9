"""One flat buffer for all parameters, cut into dp equal shards: the layout ZeRO-1/2/3 share.

Chapter "Data parallelism", section ZeRO (Rajbhandari et al. 2020, "ZeRO: Memory Optimizations
Toward Training Trillion Parameter Models"). Megatron-LM's distributed optimizer and PyTorch FSDP
use the same idea: lay the parameters end to end in one 1-D buffer, pad it to a multiple of dp,
and let dp rank r own elements [r*S, (r+1)*S) with S = padded / dp.

    params (in named_parameters order)   |--- w0 ---|-- w1 --|------ w2 ------|pad|
    dp = 4 shards of S elements           | rank 0 | rank 1 | rank 2 | rank 3 |

A parameter may straddle two shards; nothing here cares, because every collective works on the
whole flat buffer (reduce-scatter in, all-gather out). ``labkit.calc.memory.zero_memory_per_rank``
uses the same padding rule: a sharded quantity takes ceil(num_params / dp) elements per rank.
Pure: no torch.distributed. Tested in one process (tests/test_zero.py).
"""
from __future__ import annotations

import math

import torch

from ..validate import positive_int


class ShardLayout:
    """Where each parameter lives in the flat buffer and which slice of it each dp rank owns."""

    def __init__(self, numels: list[int], dp: int):
        positive_int("dp", dp)
        self.numels, self.dp = list(numels), dp
        self.offsets = [0]
        for n in self.numels:                       # parameter i: flat[offsets[i]:offsets[i+1]]
            self.offsets.append(self.offsets[-1] + n)
        self.numel = self.offsets[-1]                # P, real parameters
        self.shard_numel = math.ceil(self.numel / dp)  # S = ceil(P / dp)
        self.padded_numel = self.shard_numel * dp    # P padded with zeros to a multiple of dp

    def shard_range(self, dp_rank: int) -> tuple[int, int]:
        """[lo, hi) of the flat buffer that ``dp_rank`` owns (its optimizer state, its gradients)."""
        return dp_rank * self.shard_numel, (dp_rank + 1) * self.shard_numel

    def runs(self, names, lo: int, hi: int) -> list[tuple[str, int, int, int]]:
        """What the shard [lo, hi) of the buffer holds: [(name, a, b, base)], its elements
        [base, base + b - a) are elements [a, b) of parameter ``name`` (flattened; padding skipped)."""
        out = []
        for name, start, end in zip(names, self.offsets, self.offsets[1:]):
            a, b = max(start, lo), min(end, hi)
            if a < b:
                out.append((name, a - start, b - start, a - lo))
        return out

    def flatten(self, tensors) -> torch.Tensor:
        """[padded_numel]: the tensors end to end, zero-padded (None counts as zeros)."""
        ref = next(t for t in tensors if t is not None)
        flat = ref.new_zeros(self.padded_numel)
        for t, lo, hi in zip(tensors, self.offsets, self.offsets[1:]):
            if t is not None:
                flat[lo:hi].copy_(t.reshape(-1))
        return flat

    def views(self, flat: torch.Tensor, shapes) -> list[torch.Tensor]:
        """Views into ``flat`` with the parameters' shapes: writing one writes the buffer."""
        return [flat[lo:hi].view(shape) for lo, hi, shape in zip(self.offsets, self.offsets[1:], shapes)]

    def bind(self, params, flat: torch.Tensor) -> None:
        """Copy ``params`` into ``flat`` and make each ``param.data`` a view of it (one storage)."""
        with torch.no_grad():
            for p, v in zip(params, self.views(flat, [p.shape for p in params])):
                v.copy_(p)
                p.data = v


def storage_bytes(tensors) -> int:
    """Bytes of the distinct storages behind ``tensors`` (views of one buffer count once).

    This is what a rank actually holds: a ZeRO-3 parameter whose storage was freed counts 0.
    """
    seen, total = set(), 0
    for t in tensors:
        if t is None:
            continue
        s = t.untyped_storage()
        if s.data_ptr() in seen:
            continue
        seen.add(s.data_ptr())
        total += s.nbytes()
    return total


def optimizer_state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Bytes of AdamW's two moments (exp_avg, exp_avg_sq). The ``step`` counters (one scalar per
    tensor) are not counted: calc's ``bytes_optim = 8`` per parameter is the two fp32 moments."""
    return storage_bytes(v for state in optimizer.state.values()
                         for k, v in state.items() if k in ("exp_avg", "exp_avg_sq"))

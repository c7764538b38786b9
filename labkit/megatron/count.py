"""Bytes per collective of a Megatron-Core step, counted on every rank at the dispatcher
(``labkit.native.count.ByteCounter``: what this rank sends under the textbook algorithm, the
convention of labkit's own counters and ``labkit.calc``), with the one op Megatron adds: its DDP
and distributed optimizer issue their bucket collectives inside ``torch.distributed._coalescing_manager``
(distributed/param_and_grad_buffer.py), which gloo runs as ``allreduce_coalesced_``.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from ..native.count import ByteCounter, textbook_bytes, _nbytes

_COALESCED = {torch.ops.c10d.allreduce_coalesced_.default: "all_reduce"}


class MegatronByteCounter(ByteCounter):
    """:class:`ByteCounter` that also counts coalesced all-reduces (a list of tensors, one group)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        op = _COALESCED.get(func)
        if op is None:
            return super().__torch_dispatch__(func, types, args, kwargs)
        pg = self._group(1, args)
        n = dist.get_world_size(pg)
        sent = textbook_bytes(op, n, _nbytes(args[0]))
        axis = self.axes.get(pg.group_name) or self._by_ranks(pg)
        self.calls[axis][op] += 1
        self.bytes[axis][op] += sent
        self.log.append((axis, op, sent))
        return func(*args, **(kwargs or {}))

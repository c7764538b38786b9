"""Count what a PyTorch-native step sends: calls with ``CommDebugMode``, bytes with a counter on the
same run (chapter "From labkit to PyTorch-native", "The same bytes").

``torch.distributed.tensor.debug.CommDebugMode`` counts collective *calls* per op (it is a
``TorchDispatchMode``: DTensor's redistributes, FSDP2's all-gathers and reduce-scatters and the
functional collectives all pass through the dispatcher). It does not count bytes, nor the pipeline's
point-to-point ``send``/``recv``. :class:`ByteCounter` sits at the same place and, for every
collective of a process group, records on which axis it ran and what this rank sends under the
textbook algorithm, the convention of labkit's own counters (``labkit.groups.CommStats``) and of
``labkit.calc``, so the three compare exactly:

    all-reduce 2 (n-1)/n N    all-gather, reduce-scatter, all-to-all (n-1)/n N    send N
    (N: bytes of the full tensor, n: ranks in the group)

Why not a Python subclass of ``ProcessGroup`` wrapping gloo (a "counting process group")? Tried
with the pinned torch: the functional collectives DTensor uses refuse it ("ProcessGroup name not
set") and ``all_gather_into_tensor`` finds no backend behind it ("No backend type associated with
device type cpu"). The dispatcher sees every op the process group runs, with its group as an
argument, so the counter reads the group there.
"""
from __future__ import annotations

from collections import defaultdict

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

_c10d, _fun = torch.ops.c10d, torch.ops._c10d_functional

# op -> (labkit's op name, where the tensor of size N is, where the group is)
#   ("in"|"out", i): N is argument i (a list: summed); ("gathered", i): N is n x argument i;
#   group: an argument index, or ("name", i) for the functional ops (the group's name).
_OPS = {
    _c10d.allreduce_.default: ("all_reduce", ("in", 0), 1),
    _c10d._allgather_base_.default: ("all_gather", ("out", 0), 2),
    _c10d.allgather_into_tensor_coalesced_.default: ("all_gather", ("out", 0), 2),
    _c10d._reduce_scatter_base_.default: ("reduce_scatter", ("in", 1), 2),
    _c10d.reduce_scatter_tensor_coalesced_.default: ("reduce_scatter", ("in", 1), 2),
    _c10d.alltoall_base_.default: ("all_to_all", ("in", 1), 2),
    _c10d.broadcast_.default: ("broadcast", ("in", 0), 1),
    _c10d.send.default: ("send", ("in", 0), 1),
    _fun.all_reduce.default: ("all_reduce", ("in", 0), ("name", 2)),
    _fun.all_reduce_.default: ("all_reduce", ("in", 0), ("name", 2)),
    _fun.all_gather_into_tensor.default: ("all_gather", ("gathered", 0), ("name", 2)),
    _fun.reduce_scatter_tensor.default: ("reduce_scatter", ("in", 0), ("name", 3)),
    _fun.all_to_all_single.default: ("all_to_all", ("in", 0), ("name", 3)),
    _fun.broadcast.default: ("broadcast", ("in", 0), ("name", 2)),
    torch.ops._dtensor.shard_dim_alltoall.default: ("all_to_all", ("in", 0), ("name", 3)),
}


def _nbytes(t) -> int:
    if isinstance(t, (list, tuple)):
        return sum(_nbytes(x) for x in t)
    return t.numel() * t.element_size()


def textbook_bytes(op: str, n: int, full: float) -> float:
    """Bytes one rank sends for ``op`` over ``n`` ranks on a full tensor of ``full`` bytes."""
    if op == "all_reduce":
        return 2 * (n - 1) / n * full
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n * full
    return float(full)                              # broadcast (root), send


class ByteCounter(TorchDispatchMode):
    """``with ByteCounter(axes) as bc: step()``; then ``bc.table()`` -> {axis: {op: {"calls",
    "bytes"}}} for this rank. ``axes``: {axis name: ProcessGroup} (e.g. from :func:`mesh_groups`);
    a group that is none of these objects takes the name of the axis with its ranks (DTensor caches
    by mesh equality: a second mesh of the same shape in one process runs some collectives on the
    first mesh's groups, other objects over the same ranks), else it is counted as "ranks 0,1"."""

    def __init__(self, axes: dict):
        super().__init__()
        self.supports_higher_order_operators = True
        self.axes, self.by_ranks = {}, {}
        for axis, pg in axes.items():
            self.axes.setdefault(pg.group_name, axis)   # first name wins (dp before dp_cp ...)
            self.by_ranks.setdefault(tuple(dist.get_process_group_ranks(pg)), axis)
        self.calls = defaultdict(lambda: defaultdict(int))
        self.bytes = defaultdict(lambda: defaultdict(float))
        self.log: list[tuple[str, str, float]] = []    # (axis, op, bytes) in the order issued

    def _by_ranks(self, pg) -> str:
        ranks = tuple(dist.get_process_group_ranks(pg))
        return self.by_ranks.get(ranks) or "ranks " + ",".join(map(str, ranks))

    def _group(self, where, args):
        if isinstance(where, tuple):                    # functional op: the group's name
            from torch.distributed.distributed_c10d import _resolve_process_group
            return _resolve_process_group(args[where[1]])
        pg = args[where]                                # a c10d op: the group, boxed for the dispatcher
        return pg if isinstance(pg, dist.ProcessGroup) else dist.ProcessGroup.unbox(pg)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        from torch.distributed.tensor import DTensor
        if isinstance(func, torch._ops.HigherOrderOperator):
            return func(*args, **(kwargs or {}))
        if any(issubclass(t, DTensor) for t in types):
            # as CommDebugMode does: let DTensor run first and turn the op into collectives on
            # plain tensors, which come back through this mode (else they would pass unseen)
            return NotImplemented
        spec = _OPS.get(func)
        if spec is not None:
            op, (side, i), where = spec
            pg = self._group(where, args)
            n = dist.get_world_size(pg)
            full = _nbytes(args[i]) * (n if side == "gathered" else 1)   # the full tensor
            if op == "broadcast" and func is _c10d.broadcast_.default and args[2] != pg.rank():
                full = 0                                # only the root sends
            axis = self.axes.get(pg.group_name) or self._by_ranks(pg)
            sent = textbook_bytes(op, n, full)
            self.calls[axis][op] += 1
            self.bytes[axis][op] += sent
            self.log.append((axis, op, sent))
        return func(*args, **(kwargs or {}))

    def table(self) -> dict:
        return {axis: {op: {"calls": self.calls[axis][op], "bytes": self.bytes[axis][op]}
                       for op in sorted(self.calls[axis])} for axis in sorted(self.calls)}


def comm_debug_counts(mode) -> dict:
    """``CommDebugMode.get_comm_counts()`` as {op name: calls} (e.g. "c10d._allgather_base_")."""
    return {str(k): v for k, v in sorted(mode.get_comm_counts().items(), key=lambda kv: str(kv[0]))}

"""Count every collective on every process group, below labkit's own wrappers.

labkit's ``group.stats`` counts what goes through ``labkit.comm``; a student who calls
``torch.distributed.all_gather(..., group=group.pg)``, ``torch.distributed.nn.functional``, or
labkit's ``uncounted(group)`` bypasses it. So a check's ranks run on a process group that counts:
:func:`install` replaces the rank's default group by :class:`CountingPG`, a ``ProcessGroup``
written in Python that wraps gloo's and counts each call before passing it on. Every group made
afterwards (``dist.new_group``, labkit's ``build_groups``) is one too, so no collective on any
group escapes the count.

Bytes are what one rank sends under the textbook algorithm, as labkit's ``CommStats`` and
``labkit.calc.comm`` count them (N = the full tensor): all-reduce 2(n-1)/n N; all-gather,
reduce-scatter, all-to-all (n-1)/n N; broadcast N on every rank of the chain but the last; send N.

``all_to_all_single`` also checks its split sizes against every peer's before gloo sees them:
gloo aborts the process (SIGABRT, "exited with code -6") on sizes that do not match; here the
rank raises a ValueError that says which rank sends how many rows to which.
"""
from __future__ import annotations

import datetime
import os
from collections import defaultdict

BACKEND = "labkit_counting"
_PGS: list = []               # every CountingPG of this process, in creation order
_state = {"registered": False, "installed": False}


def _nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _make_class():
    import torch
    import torch.distributed as dist

    class CountingPG(dist.ProcessGroup):
        """A gloo process group that counts calls and bytes per op (and per dtype)."""

        def __init__(self, inner):
            super().__init__(inner.rank(), inner.size())
            self.inner = inner
            self.calls = defaultdict(int)
            self.bytes = defaultdict(float)
            self.by_dtype = defaultdict(lambda: defaultdict(float))

        def _count(self, op, nbytes, tensors=()):
            """``nbytes`` sent in ``op``, shared among the dtypes of ``tensors`` by their sizes."""
            self.calls[op] += 1
            self.bytes[op] += nbytes
            total = _nbytes(tensors)
            for t in tensors:
                share = t.numel() * t.element_size() / total if total else 0.0
                self.by_dtype[op][str(t.dtype).removeprefix("torch.")] += nbytes * share

        def getBackendName(self):  # noqa: N802 - torch's name
            return BACKEND

        # -- collectives (the names torch.distributed calls on a ProcessGroup) ---------------
        def allreduce(self, tensors, opts):
            n = self.size()
            self._count("all_reduce", 2 * (n - 1) / n * _nbytes(tensors), tensors)
            return self.inner.allreduce(tensors, opts)

        def allreduce_coalesced(self, tensors, opts):
            n = self.size()
            self._count("all_reduce", 2 * (n - 1) / n * _nbytes(tensors), tensors)
            return self.inner.allreduce_coalesced(tensors, opts)

        def allgather(self, outputs, inputs, opts):
            self._count("all_gather", (self.size() - 1) * _nbytes(inputs), inputs)
            return self.inner.allgather(outputs, inputs, opts)

        def all_gather_single(self, output, input, opts):
            self._count("all_gather", (self.size() - 1) * _nbytes([input]), [input])
            return self.inner._allgather_base(output, input, opts)

        def reduce_scatter(self, outputs, input_lists, opts):
            flat = [t for lst in input_lists for t in lst]
            n = self.size()
            self._count("reduce_scatter", (n - 1) / n * _nbytes(flat), flat)
            return self.inner.reduce_scatter(outputs, input_lists, opts)

        def reduce_scatter_single(self, output, input, opts):
            n = self.size()
            self._count("reduce_scatter", (n - 1) / n * _nbytes([input]), [input])
            return self.inner._reduce_scatter_base(output, input, opts)

        def all_to_all_single(self, output, input, output_splits, input_splits, opts):
            ins, outs = _checked_splits(self, output, input, list(output_splits), list(input_splits))
            row = _nbytes([input]) / max(1, input.shape[0]) if input.dim() else 0
            sent = sum(k for j, k in enumerate(ins) if j != self.rank()) * row
            self._count("all_to_all", sent, [input])
            return self.inner.alltoall_base(output, input, list(output_splits), list(input_splits), opts)

        def alltoall(self, outputs, inputs, opts):
            sent = [t for j, t in enumerate(inputs) if j != self.rank()]
            self._count("all_to_all", _nbytes(sent), sent)
            return self.inner.alltoall(outputs, inputs, opts)

        def broadcast(self, tensors, opts):
            n = self.size()
            if (self.rank() - opts.rootRank) % n != n - 1:   # a chain from the root: all but the last forward
                self._count("broadcast", _nbytes(tensors), tensors)
            else:
                self._count("broadcast", 0.0)
            return self.inner.broadcast(tensors, opts)

        def reduce(self, tensors, opts):
            self._count("reduce", 0.0 if self.rank() == opts.rootRank else _nbytes(tensors), tensors)
            return self.inner.reduce(tensors, opts)

        def gather(self, outputs, inputs, opts):
            self._count("gather", 0.0 if self.rank() == opts.rootRank else _nbytes(inputs), inputs)
            return self.inner.gather(outputs, inputs, opts)

        def scatter(self, outputs, inputs, opts):
            sent = [t for lst in inputs for j, t in enumerate(lst) if j != self.rank()]
            self._count("scatter", _nbytes(sent), sent)
            return self.inner.scatter(outputs, inputs, opts)

        def send(self, tensors, dst, tag):
            self._count("send", _nbytes(tensors), tensors)
            return self.inner.send(tensors, dst, tag)

        def recv(self, tensors, src, tag):
            self._count("recv", 0.0)
            return self.inner.recv(tensors, src, tag)

        def recv_anysource(self, tensors, tag):
            self._count("recv", 0.0)
            return self.inner.recv_anysource(tensors, tag)

        def barrier(self, opts):
            return self.inner.barrier(opts)

        def monitored_barrier(self, *args):
            return self.inner.monitored_barrier(*args)

    return CountingPG, torch, dist


def _checked_splits(pg, output, input, output_splits, input_splits):
    """Every rank's input split sizes, compared with what each rank expects; a ValueError naming
    the mismatch instead of gloo's abort. Returns (this rank's input splits, output splits)."""
    import torch
    n, me = pg.size(), pg.rank()
    rows_in, rows_out = (input.shape[0] if input.dim() else 0), (output.shape[0] if output.dim() else 0)
    ins = input_splits or ([rows_in // n] * n if rows_in % n == 0 else None)
    outs = output_splits or ([rows_out // n] * n if rows_out % n == 0 else None)
    mine = torch.tensor(ins if ins is not None and len(ins) == n else [-1] * n, dtype=torch.int64)
    every = [torch.empty_like(mine) for _ in range(n)]
    pg.inner.allgather([every], [mine], _allgather_options()).wait()     # uncounted: checking only
    problems = []
    if ins is None or len(ins) != n:
        problems.append(f"input_split_sizes {input_splits} must list {n} sizes (one per rank)"
                        if input_splits else f"{rows_in} input rows do not split into {n} equal chunks")
    elif sum(ins) != rows_in:
        problems.append(f"input_split_sizes {ins} add up to {sum(ins)}, but the input has {rows_in} rows")
    if outs is None or len(outs) != n:
        problems.append(f"output_split_sizes {output_splits} must list {n} sizes (one per rank)"
                        if output_splits else f"{rows_out} output rows do not split into {n} equal chunks")
    elif sum(outs) != rows_out:
        problems.append(f"output_split_sizes {outs} add up to {sum(outs)}, but the output has {rows_out} rows")
    elif not problems:
        for j in range(n):
            sends = int(every[j][me])
            if sends >= 0 and sends != outs[j]:
                problems.append(f"rank {j} sends {sends} rows to rank {me} (its input_split_sizes[{me}]), "
                                f"but rank {me} expects {outs[j]} (its output_split_sizes[{j}])")
    if problems:
        raise ValueError(f"all_to_all_single on rank {me}: " + "; ".join(problems[:3]))
    return ins, outs


def _allgather_options():
    from torch._C._distributed_c10d import AllgatherOptions
    return AllgatherOptions()


def _create(store, rank, size, timeout):
    import torch.distributed as dist
    pg = _CLASS[0](dist.ProcessGroupGloo(store, rank, size, timeout))
    _PGS.append(pg)
    return pg


_CLASS: list = []


def register() -> None:
    """Make the ``labkit_counting`` backend known to torch.distributed in this process."""
    if _state["registered"]:
        return
    cls, _, dist = _make_class()
    _CLASS.append(cls)
    dist.Backend.register_backend(BACKEND, _create, devices=["cpu"])
    _state["registered"] = True


def install(timeout: float = 120.0) -> None:
    """In a rank started by ``labkit.launch``: replace the default process group by a counting one
    (same ranks, same rendezvous); every group made afterwards counts too. Idempotent."""
    import torch.distributed as dist
    if _state["installed"]:
        return
    register()
    rank, world = dist.get_rank(), dist.get_world_size()
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                          timeout=datetime.timedelta(seconds=timeout))
    dist.destroy_process_group()
    dist.init_process_group(BACKEND, store=dist.PrefixStore("labkit-counting", store), rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=timeout))
    _state["installed"] = True


def snapshot() -> dict:
    """{op: {"calls", "bytes", "by_dtype": {dtype: bytes}}}, summed over every group of this rank."""
    out: dict = {}
    for pg in _PGS:
        for op, calls in pg.calls.items():
            d = out.setdefault(op, {"calls": 0, "bytes": 0.0, "by_dtype": {}})
            d["calls"] += calls
            d["bytes"] += pg.bytes[op]
            for dt, b in pg.by_dtype[op].items():
                d["by_dtype"][dt] = d["by_dtype"].get(dt, 0.0) + b
    return out


def difference(after: dict, before: dict) -> dict:
    """``after - before`` of two snapshots (ops with no new call dropped)."""
    out = {}
    for op, a in after.items():
        b = before.get(op, {"calls": 0, "bytes": 0.0, "by_dtype": {}})
        if a["calls"] == b["calls"]:
            continue
        out[op] = {"calls": a["calls"] - b["calls"], "bytes": a["bytes"] - b["bytes"],
                   "by_dtype": {dt: v - b["by_dtype"].get(dt, 0.0) for dt, v in a["by_dtype"].items()}}
    return out

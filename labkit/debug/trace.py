"""Every collective a rank issues, with fingerprints of what went in and what came out.

Chapter "When training goes wrong", section "The first divergence". While a :class:`Tracer` is
installed, the ``torch.distributed`` functions labkit calls (``all_reduce``, ``all_gather``,
``reduce_scatter``, ``all_to_all_single``, ``broadcast``, ``batch_isend_irecv``, ...) are wrapped in
this process: each call is recorded as a :class:`Collective` (its op, the labkit group it ran on,
the shapes, a hash and a norm of its inputs when issued and of its outputs when complete (an
asynchronous one: at its ``wait()``), where the training was (iteration, phase, microbatch, layer)
and the labkit code that issued it). Two runs of the same layout issue the same collectives with
the same inputs and outputs, bit for bit: the first index where they differ is where one of them
went wrong. Nothing changes what the collectives compute; ``uninstall()`` puts the originals back.
"""
from __future__ import annotations

import hashlib
import inspect
import sys
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

# op -> (names of the input arguments, names of the output arguments)
OPS = {
    "all_reduce": (("tensor",), ("tensor",)),
    "all_gather": (("tensor",), ("tensor_list",)),
    "all_gather_into_tensor": (("input_tensor",), ("output_tensor",)),
    "reduce_scatter": (("input_list",), ("output",)),
    "reduce_scatter_tensor": (("input",), ("output",)),
    "all_to_all": (("input_tensor_list",), ("output_tensor_list",)),
    "all_to_all_single": (("input",), ("output",)),
    "broadcast": (("tensor",), ("tensor",)),
    "send": (("tensor",), ()),
    "recv": ((), ("tensor",)),
    "barrier": ((), ()),
}
GROUP_ORDER = ("tp", "cp", "pp", "dp", "ep", "etp", "edp", "etp_ep", "dp_cp", "tp_kv", "embd", "world")


@dataclass
class Collective:
    """One collective call on one rank."""

    index: int                 # its place among this rank's collectives
    op: str
    group: str                 # labkit's name of the group ("tp", "dp", ...; "world")
    shapes: tuple              # input shapes, then output shapes
    where: tuple               # (iteration, phase, microbatch, layer) when issued
    site: str                  # the labkit code that issued it
    clock: int                 # the rank's event clock (orders it among fingerprints)
    inputs: tuple = ()         # (hash, norm) of the inputs when issued
    outputs: tuple | None = None   # (hash, norm) of the outputs once complete

    def same_as(self, other: "Collective") -> bool:
        return (self.op, self.group, self.shapes, self.inputs, self.outputs) == \
            (other.op, other.group, other.shapes, other.inputs, other.outputs)

    def describe(self) -> str:
        it, phase, mb, layer = self.where
        at = f"iteration {it}, {phase}" + (f", microbatch {mb}" if mb is not None else "") + \
             (f", {layer}" if layer is not None else "")
        return f"{self.op} on {self.group} #{self.index} ({at}; {self.site})"


def fingerprint(tensors) -> tuple[str, float]:
    """(blake2b of the bytes, float64 norm) of a list of tensors: equal iff bit-identical."""
    h, sq = hashlib.blake2b(digest_size=12), 0.0
    for t in tensors:
        t = t.detach().contiguous().cpu()
        h.update(str((tuple(t.shape), str(t.dtype))).encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
        if t.is_floating_point():
            sq += float(t.double().pow(2).sum())
    return h.hexdigest(), sq ** 0.5


def _flat(value) -> list:
    if value is None:
        return []
    return list(value) if isinstance(value, (list, tuple)) else [value]


def _site() -> str:
    """The two innermost frames of labkit outside comm.py and labkit/debug: who issued it, by file
    and function (no line: a report that reads the same after an unrelated edit of that file)."""
    out, f = [], sys._getframe(2)
    while f is not None and len(out) < 2:
        path = f.f_code.co_filename.replace("\\", "/")
        if "/labkit/" in path and "/labkit/debug/" not in path and not path.endswith("/labkit/comm.py"):
            out.append(f"{path.split('/labkit/')[-1]} {f.f_code.co_name}")
        f = f.f_back
    return " <- ".join(out) or "?"


class _Work:
    """An asynchronous collective's handle; fingerprints the outputs when waited on."""

    def __init__(self, work, done):
        self._work, self._done = work, done

    def wait(self, *args, **kwargs):
        out = self._work.wait(*args, **kwargs)
        self._done()
        return out

    def __getattr__(self, name):
        return getattr(self._work, name)


@dataclass
class Tracer:
    """Wraps ``torch.distributed``'s collectives in this process while installed."""

    groups: dict                                  # labkit's {axis: Group} of this rank
    context: object = None                        # callable -> (iteration, phase, microbatch, layer)
    clock: object = None                          # callable -> next event number
    records: list = field(default_factory=list)
    quiet: bool = False                           # True while a probe's own gathers run
    _saved: dict = field(default_factory=dict)

    def group_name(self, pg) -> str:
        if pg is None or pg is dist.group.WORLD:
            return "world"
        names = [a for a, g in self.groups.items() if g.pg is pg]
        return min(names, key=lambda a: GROUP_ORDER.index(a) if a in GROUP_ORDER else 99) if names else "other"

    def install(self) -> "Tracer":
        for op, (ins, outs) in OPS.items():
            self._wrap(op, ins, outs)
        original = dist.batch_isend_irecv
        self._saved["batch_isend_irecv"] = original

        def batch(ops):
            if self.quiet:
                return original(ops)
            sends = [o.tensor for o in ops if o.op in (dist.isend,)]
            recvs = [o.tensor for o in ops if o.op not in (dist.isend,)]
            rec = self._record("batch_isend_irecv", self.group_name(ops[0].group if ops else None), sends, recvs)
            works, left = original(ops), [len(ops)]

            def done():
                left[0] -= 1
                if left[0] == 0:
                    rec.outputs = fingerprint(recvs)
            return [_Work(w, done) for w in works]
        dist.batch_isend_irecv = batch
        return self

    def uninstall(self) -> None:
        for name, fn in self._saved.items():
            setattr(dist, name, fn)
        self._saved.clear()

    def _record(self, op, group, ins, outs) -> Collective:
        rec = Collective(len(self.records), op, group,
                         tuple(tuple(t.shape) for t in ins) + ("->",) + tuple(tuple(t.shape) for t in outs),
                         self.context() if self.context else (None, None, None, None), _site(),
                         self.clock() if self.clock else 0, fingerprint(ins))
        self.records.append(rec)
        return rec

    def _wrap(self, op, ins, outs) -> None:
        original = getattr(dist, op)
        sig = inspect.signature(original)
        self._saved[op] = original

        def wrapper(*args, **kwargs):
            if self.quiet:
                return original(*args, **kwargs)
            bound = sig.bind(*args, **kwargs).arguments
            tin = [t for name in ins for t in _flat(bound.get(name))]
            tout = [t for name in outs for t in _flat(bound.get(name))]
            rec = self._record(op, self.group_name(bound.get("group")), tin, tout)
            work = original(*args, **kwargs)

            def done():
                rec.outputs = fingerprint(tout)
            if bound.get("async_op") and work is not None:
                return _Work(work, done)
            done()
            return work
        setattr(dist, op, wrapper)

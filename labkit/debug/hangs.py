"""Hangs and aborts as they really behave on gloo, and the four ways to find them.

Chapter "When training goes wrong", section "Hangs". Each scenario is a function run on 2 gloo
ranks (``labkit.launch``). What the pinned torch does with them (measured on this project's
machines; tests/test_debug_hangs.py checks each):

    mismatched_op       all_reduce on rank 0, broadcast on rank 1       hangs until a timeout
    skipped_collective  rank 1 skips an all_reduce (a rank-dependent branch)   hangs
    send_without_recv   a pipeline send nobody receives                  hangs (the send waits)
    mismatched_shapes   all_reduce of 4 elements on rank 0, 8 on rank 1  rank 0 aborts (SIGABRT)
    swapped             two same-shape all_reduces, swapped on rank 1    returns at once, WRONG values

(rank 1 is the default ``culprit``, the rank that does the odd thing; ``culprit=0`` swaps the roles).

``TORCH_DISTRIBUTED_DEBUG=DETAIL`` (``detail=True``) checks every collective's op and shapes across
the ranks first: the mismatched op and the mismatched shapes (and a skipped collective followed
by another op) become an immediate RuntimeError naming both; the swap stays silent (same ops,
same shapes). The means to find a hang (:func:`run_hang`):

    the launch timeout   labkit.launch stops the ranks and names, per rank, the collective it
                         waits in (faulthandler stack dumps: labkit/debug/stacks.py)
    collective_timeout   the process group's timeout: the waiting rank raises instead of hanging
    Flight Recorder      TORCH_FR_BUFFER_SIZE: each rank's last collectives with sequence numbers
                         (on gloo every entry reads "scheduled", even finished ones: compare the
                         sequence numbers across ranks to find the one that is behind)
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field


def _wrap_fr(body, flight_recorder: bool, culprit: int = 1):
    """Run ``body`` (the odd rank is ``culprit``); with the Flight Recorder on, send this rank's
    trace to the caller first if it fails (a collective timeout), then fail."""
    import torch.distributed as dist

    from labkit.launcher import send_to_parent
    try:
        if flight_recorder:                       # a few collectives that go well first
            for _ in range(3):
                dist.all_reduce(__import__("torch").ones(4))
        body(dist.get_rank(), culprit)
        dist.barrier()                            # the collective the other rank meets next
    except RuntimeError:
        if flight_recorder:
            send_to_parent(("flight_recorder", dist.get_rank(), flight_recorder_entries()))
        raise


def mismatched_op(rank, culprit=1):
    import torch
    import torch.distributed as dist
    x = torch.ones(4)
    if rank != culprit:
        dist.all_reduce(x)
    else:
        dist.broadcast(x, src=1 - culprit)


def skipped_collective(rank, culprit=1):
    import torch
    import torch.distributed as dist
    x = torch.ones(4)
    if rank != culprit:                           # e.g. "only rank 0 logs the global norm"
        dist.all_reduce(x)


def send_without_recv(rank, culprit=1):
    import torch
    import torch.distributed as dist
    if rank != culprit:                           # one stage sends an activation; the other never receives
        dist.send(torch.ones(4), dst=culprit)


def mismatched_shapes(rank, culprit=1):
    import torch
    import torch.distributed as dist
    dist.all_reduce(torch.ones(8 if rank == culprit else 4))


def swapped(rank, culprit=1):
    import torch
    import torch.distributed as dist

    from labkit.launcher import send_to_parent
    a, b = torch.full((4,), 1.0 + rank), torch.full((4,), 10.0 * (rank + 1))
    first, second = (b, a) if rank == culprit else (a, b)
    dist.all_reduce(first)
    dist.all_reduce(second)
    send_to_parent(("values", rank, {"a": a[0].item(), "b": b[0].item()}))   # right: a 3.0, b 30.0


HANGS = {f.__name__: f for f in (mismatched_op, skipped_collective, send_without_recv, mismatched_shapes, swapped)}


def flight_recorder_entries() -> list[dict]:
    """This rank's Flight Recorder trace: [{"seq", "op", "state", "sizes"}] (gloo records too)."""
    import json

    import torch._C._distributed_c10d as c10d
    trace = json.loads(c10d._dump_fr_trace_json())
    return [{"seq": e.get("collective_seq_id"), "op": e.get("profiling_name", "").split(":")[-1],
             "state": e.get("state"), "sizes": e.get("input_sizes")} for e in trace.get("entries", [])]


@dataclass
class Outcome:
    """What a scenario did: ``kind`` "hang" (stopped at the launch timeout), "error" (a rank
    raised: a collective timeout, or DETAIL's mismatch), "abort" (a rank died by a signal) or
    "returned"; ``seconds`` of wall time; the launcher's ``report``; per rank where it waited,
    what it sent back (values, Flight Recorder entries)."""

    name: str
    kind: str
    seconds: float
    report: str
    waits: dict = field(default_factory=dict)
    messages: list = field(default_factory=list)

    def flight_recorder(self) -> dict:
        return {rank: entries for kind, rank, entries in self.messages if kind == "flight_recorder"}


def run_hang(name: str, timeout: float = 3.0, detail: bool = False, collective_timeout: float | None = None,
             flight_recorder: bool = False, culprit: int = 1) -> Outcome:
    """Run scenario ``name`` of :data:`HANGS` on 2 gloo ranks (``culprit``: the rank that does the
    odd thing) and say how it ended."""
    import labkit
    from labkit.launch_collect import LaunchTimeout, RankFailed
    if name not in HANGS:
        raise ValueError(f"name must be one of {sorted(HANGS)}, got {name!r}")
    env = {"TORCH_DISTRIBUTED_DEBUG": "DETAIL" if detail else None,
           "TORCH_FR_BUFFER_SIZE": "64" if flight_recorder else None}
    saved = {k: os.environ.get(k) for k in env}
    messages = []
    kw = {} if collective_timeout is None else {"collective_timeout": collective_timeout}
    t0 = time.perf_counter()
    try:
        for k, v in env.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
        labkit.launch(_wrap_fr, 2, HANGS[name], flight_recorder, culprit, backend="gloo", timeout=timeout,
                      on_message=messages.append, **kw)
        kind, report, waits = "returned", "", {}
    except LaunchTimeout as e:
        kind, report, waits = "hang", str(e).split("\n--- captured output")[0], e.waits
    except RankFailed as e:
        signal = "killed by SIG" in e.remote_traceback
        kind, report, waits = ("abort" if signal else "error"), e.summary, {}
    finally:
        for k, v in saved.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
    return Outcome(name, kind, time.perf_counter() - t0, report, waits, messages)

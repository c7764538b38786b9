"""Checks for the Collectives lab: a ring all-gather and a ring all-reduce built from send/recv.

Chapter "Collectives" (book/collectives.ipynb), lab labs/collectives-lab.ipynb. The student writes
``fn(group, x) -> tensor`` from the point-to-point helpers of :mod:`labkit.comm`
(``send``/``recv``/``send_recv``); the check runs it on N ranks and compares, in this order:

1. it ran: a crash or a hang (a send nobody receives) becomes a FAIL line, not a stuck cell;
2. the values: inputs are integers stored as float64, so every summation order gives the same
   float and "equal to the sum" is exact; a gather whose chunks are right but misplaced is named;
3. what went over the wire, counted below labkit on every group (:mod:`labkit.check.instrument`):
   no collective at all (``torch.distributed``'s included), and the float64 bytes each rank sent
   point-to-point equal the ring's volume, 2(n-1)/n x N for all-reduce, (n-1)/n x N for all-gather
   (N = bytes of the full result; Patarasuk & Yuan 2009). Sending everything to everyone fails.

labkit's own collectives raise while the student's function runs; point-to-point stays allowed.
"""
from __future__ import annotations

from . import describe_mismatch, report
from .hints import asker
from .spec import Spec, failed, ranks, run
from .compare import far

OWN_COLLECTIVES = tuple(f"labkit.comm:{op}" for op in ("all_reduce", "all_gather", "reduce_scatter",
                                                       "all_to_all", "broadcast"))
WHY = "build the ring from comm.send_recv (point-to-point only)"


def inputs(rank: int, numel: int, seed: int):
    """Rank ``rank``'s input: integers in float64, so any order of additions is exact."""
    import torch
    gen = torch.Generator().manual_seed(seed + rank)
    return torch.randint(-100, 100, (numel,), generator=gen).double()


def _worker(student, numel: int, seed: int):
    import torch.distributed as dist

    from labkit.groups import world_group

    from . import instrument
    instrument.install()
    fn = student.load()["fn"]
    group = world_group()
    x = inputs(dist.get_rank(), numel, seed)
    before, x0 = instrument.snapshot(), x.clone()
    with student.banning(OWN_COLLECTIVES, WHY):
        got = fn(group, x)
    out = {"got": got.detach().cpu() if hasattr(got, "detach") else None, "got_type": type(got).__name__,
           "counts": instrument.difference(instrument.snapshot(), before)}
    out["input_changed"] = not bool((x == x0).all())
    return out


def _misplaced_chunks(got, expected, n) -> str | None:
    """For a gather: 'position i holds rank j's chunk' when only the order is wrong."""
    if got.shape != expected.shape or got.numel() % n:
        return None
    g, e = got.reshape(n, -1), expected.reshape(n, -1)
    where = []
    for i in range(n):
        owners = [j for j in range(n) if bool((g[i] == e[j]).all())]
        if not owners:
            return None
        if i not in owners:
            where.append(f"position {i} holds rank {owners[0]}'s chunk")
    return "; ".join(where) or None


def _judge(op: str, name: str, data, world_size: int, numel: int, seed: int):
    import torch
    title = f"{name} ({world_size} ranks)"
    bad = failed(title, data)
    if bad is not None:
        return bad
    xs = [inputs(r, numel, seed) for r in range(world_size)]
    expected = torch.stack(xs).sum(0) if op == "all_reduce" else torch.cat(xs)
    for r, out in enumerate(data):
        if out["got"] is None:
            return report(title, False, f"rank {r} returned {out['got_type']}, not a tensor",
                          "return the result tensor")
        problem = describe_mismatch(out["got"], expected, what=f"rank {r}, ")
        if problem:
            misplaced = _misplaced_chunks(out["got"], expected, world_size) if op == "all_gather" else None
            if misplaced:
                return report(title, False, f"rank {r}: every chunk is there but in the wrong place: {misplaced}",
                              "put the chunk that started on rank j at position j, whatever step it arrives at")
            return report(title, False, problem, "the values differ: print, on each rank, which chunk it "
                          "sends and which it updates at every step (labkit.launch(..., live_output=True))")
    factor = 2 if op == "all_reduce" else 1
    N = numel * 8 * (world_size if op == "all_gather" else 1)
    ideal = factor * (world_size - 1) / world_size * N
    label = "2(n-1)/n" if factor == 2 else "(n-1)/n"
    for r, out in enumerate(data):
        other = sorted(o for o in out["counts"] if o not in ("send", "recv"))
        if other:
            return report(title, False, f"right values, but rank {r} called the collective(s) {', '.join(other)}: "
                          "the exercise builds one from point-to-point messages", "use only comm.send_recv "
                          "(or comm.send / comm.recv), one chunk per step to the right neighbour")
        got = out["counts"].get("send", {}).get("by_dtype", {}).get("float64", 0.0)
        if far(got, ideal, 0.5):
            return report(title, False, f"right values, but rank {r} sent {got:.0f} bytes of data point-to-point; "
                          f"a ring sends {ideal:.0f} ({label} x {N} bytes)",
                          "a ring moves one chunk of N/n per step, to the right neighbour only")
    note = " (it also changed its input in place)" if any(o["input_changed"] for o in data) else ""
    return report(title, True, f"equals dist.{op} exactly and each rank sent {ideal:.0f} bytes, the ring's "
                  f"{label} x N{note}")


def _produce(student, world_size=4, numel=6, seed=0, timeout=60.0):
    results, failure = ranks(_worker, world_size, student, numel, seed, timeout=timeout)
    return failure or results


def _judge_gather(data, world_size=4, numel=6, seed=0, timeout=60.0):
    return _judge("all_gather", "ring_all_gather", data, world_size, numel, seed)


def _judge_reduce(data, world_size=4, numel=24, seed=0, timeout=60.0):
    return _judge("all_reduce", "ring_all_reduce", data, world_size, numel, seed)


GATHER = Spec("ring-all-gather", {"fn": "my_ring_all_gather"}, _produce, _judge_gather,
              cases=({"world_size": 4, "numel": 6},), forbid=OWN_COLLECTIVES, ranks=True, why=WHY, hints=(
                  "after n-1 steps every rank must have seen every other rank's chunk: which chunk does rank r "
                  "forward at step k?",
                  "at step k rank r forwards to rank r+1 the chunk it received at step k-1 (at step 0, its "
                  "own); the chunk received at step k started on rank r-k-1",
                  "out[r] = x; at step k send out[(r-k) % n] right and store what arrives in out[(r-k-1) % n]; "
                  "return torch.cat(out)"))
REDUCE = Spec("ring-all-reduce", {"fn": "my_ring_all_reduce"}, _produce, _judge_reduce,
              cases=({"world_size": 4, "numel": 24},), forbid=OWN_COLLECTIVES, ranks=True, why=WHY, hints=(
                  "draw the table for n = 4: at each step, which chunk does each rank send, and which does it update?",
                  "after phase 1 rank r must hold the complete sum of chunk r+1: in that phase each rank ADDS "
                  "the chunk it receives to its own",
                  "phase 1: at step k send chunk r-k and ADD the received one into chunk r-k-1; phase 2: send "
                  "chunk r+1-k and COPY the received one into chunk r-k (indices mod n)"))
SPECS = {s.id: s for s in (GATHER, REDUCE)}
hint = asker(SPECS)


def ring_all_reduce(student_fn, world_size: int = 4, numel: int = 24, seed: int = 0, timeout: float = 60.0):
    """``student_fn(group, x) -> sum of x over ranks``, using labkit.comm.send/recv/send_recv only."""
    if numel % world_size:
        raise ValueError(f"ring_all_reduce: numel {numel} must be divisible by world_size {world_size} "
                         "(the ring moves equal chunks of N/n)")
    return run(REDUCE, {"fn": student_fn}, world_size=world_size, numel=numel, seed=seed, timeout=timeout)


def ring_all_gather(student_fn, world_size: int = 4, numel: int = 6, seed: int = 0, timeout: float = 60.0):
    """``student_fn(group, x) -> concatenation of every rank's x``, in rank order, along dim 0."""
    return run(GATHER, {"fn": student_fn}, world_size=world_size, numel=numel, seed=seed, timeout=timeout)

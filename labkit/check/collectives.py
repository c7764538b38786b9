"""Checks for the Collectives lab: a ring all-reduce and a ring all-gather built from send/recv.

Chapter "Collectives" (book/collectives.ipynb), lab labs/collectives-lab.ipynb. The student writes
``fn(group, x) -> tensor`` using only the point-to-point helpers of :mod:`labkit.comm`
(``send``/``recv``/``send_recv``); the check runs it on N ranks and compares, in this order:

1. it ran: a crash or a hang (a send nobody receives) becomes a FAIL line, not a stuck cell;
2. the values: inputs are integers stored as float64, so every summation order gives the same
   float and "equal to ``dist.all_reduce``" is checked exactly; for the all-gather a result whose
   chunks are right but in the wrong places is named as such;
3. the bytes each rank sent through ``comm.send``/``comm.send_recv`` (``group.stats["send"]``)
   against the ring's volume: 2(n-1)/n x N for all-reduce, (n-1)/n x N for all-gather (N = bytes
   of the full result; Patarasuk & Yuan 2009). Code that sends everything to everyone fails here.

While the student's function runs, every collective of ``labkit.comm`` and ``torch.distributed``
raises :class:`~labkit.check.Forbidden` (point-to-point stays allowed): the ring is the exercise.
Hints escalate with each failure of the same function (``labkit.check.hint``).
"""
from __future__ import annotations

from . import describe_mismatch, forbidden, hint, report, run_student

_P2P_OPS = ("send",)  # what group.stats counts for comm.send and comm.send_recv
COLLECTIVES = tuple(f"labkit.comm:{op}" for op in ("all_reduce", "all_gather", "reduce_scatter",
                                                   "all_to_all", "broadcast")) + \
    tuple(f"torch.distributed:{op}" for op in ("all_reduce", "all_gather", "all_gather_into_tensor",
                                               "reduce_scatter", "reduce_scatter_tensor", "all_to_all",
                                               "all_to_all_single", "broadcast", "reduce"))


def _worker(student_fn, op: str, numel: int, seed: int):
    import torch
    import torch.distributed as dist

    from labkit import comm
    from labkit.groups import world_group
    from labkit.launcher import device

    group = world_group()
    gen = torch.Generator().manual_seed(seed + dist.get_rank())
    # integers in float64: any order of additions is exact, so the comparison can be exact
    x = torch.randint(-100, 100, (numel,), generator=gen).double().to(device())
    before = x.clone()
    with forbidden(*COLLECTIVES, why="build the ring from comm.send_recv (point-to-point only)"):
        got = student_fn(group, x)
    stats = group.stats.snapshot()
    reference_group = world_group()  # fresh counters: keep the reference out of the student's bytes
    reference_op = comm.all_reduce if op == "all_reduce" else comm.all_gather
    expected = reference_op(reference_group, before)
    return {"got": None if not hasattr(got, "detach") else got.detach().cpu(),
            "got_type": type(got).__name__, "expected": expected.cpu(),
            "sent": sum(stats.get(o, {}).get("bytes", 0.0) for o in _P2P_OPS),
            "other_ops": sorted(o for o in stats if o not in _P2P_OPS + ("p2p_header",)),
            "input_changed": not torch.equal(x, before), "nbytes": x.numel() * x.element_size()}


def _misplaced_chunks(got, expected, n) -> str | None:
    """For a gather: 'the chunk from rank j sits at position i' when only the order is wrong."""
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


def _check(name, student_fn, op, world_size, numel, ideal_factor, hint_values, hint_bytes, timeout,
           backend="gloo"):
    if op == "all_reduce" and numel % world_size:
        raise ValueError(f"{name}: numel {numel} must be divisible by world_size {world_size} "
                         "(the ring moves equal chunks of N/n)")
    results, failed = run_student(f"{name} ({world_size} ranks)", _worker, world_size, student_fn,
                                  op, numel, 0, timeout=timeout, student_fn=student_fn, backend=backend)
    if failed is not None:
        return failed
    title = f"{name} ({world_size} ranks)"
    for r, out in enumerate(results):
        if out["got"] is None:
            return report(title, False, f"rank {r} returned {out['got_type']}, not a tensor",
                          "return the result tensor")
        problem = describe_mismatch(out["got"], out["expected"], what=f"rank {r}, ")
        if problem:
            if op == "all_gather":
                misplaced = _misplaced_chunks(out["got"], out["expected"], world_size)
                if misplaced:
                    return report(title, False, f"rank {r}: every chunk is there but in the wrong "
                                  f"place: {misplaced}", hint(name, student_fn, [
                                      "the values are right, their positions are not",
                                      "put the chunk that started on rank j at position j, whatever "
                                      "step it arrives at"], "place"))
            return report(title, False, problem, hint(name, student_fn, hint_values, "values"))
    n, N = world_size, results[0]["nbytes"] * (world_size if op == "all_gather" else 1)
    ideal = ideal_factor * (n - 1) / n * N
    factor = f"{ideal_factor}(n-1)/n" if ideal_factor != 1 else "(n-1)/n"
    for r, out in enumerate(results):
        if abs(out["sent"] - ideal) > 0.5:
            return report(title, False, f"right values, but rank {r} sent {out['sent']:.0f} bytes "
                          f"with send/send_recv; a ring sends {ideal:.0f} ({factor} x {N} bytes)",
                          hint(name, student_fn, hint_bytes, "bytes"))
    note = " (it also changed its input in place)" if any(o["input_changed"] for o in results) else ""
    return report(title, True, f"equals dist.{op} exactly and each rank sent {ideal:.0f} bytes, "
                  f"the ring's {factor} x N{note}")


def ring_all_reduce(student_fn, world_size: int = 4, numel: int = 24, timeout: float = 60.0,
                    backend: str = "gloo"):
    """``student_fn(group, x) -> sum of x over ranks``, using labkit.comm.send/recv/send_recv only."""
    return _check("ring_all_reduce", student_fn, "all_reduce", world_size, numel, 2,
                  ["the sums are wrong: print, on each rank, which chunk it sends and which it updates "
                   "at every step (live_output=True shows rank prints)",
                   "after phase 1 rank r must hold the complete sum of chunk r+1: in that phase each "
                   "rank ADDS the chunk it receives to its own",
                   "phase 1 (reduce-scatter): n-1 steps, at step k send chunk r-k and ADD the received "
                   "one into chunk r-k-1; phase 2 (all-gather): n-1 steps, send chunk r+1-k and COPY "
                   "the received one into chunk r-k (indices mod n)"],
                  ["too many (or too few) bytes: a ring moves one chunk of N/n per step",
                   "send one chunk (N/n) per step, 2(n-1) steps, each to the right neighbour only"],
                  timeout, backend)


def ring_all_gather(student_fn, world_size: int = 4, numel: int = 6, timeout: float = 60.0,
                    backend: str = "gloo"):
    """``student_fn(group, x) -> concatenation of every rank's x``, in rank order, along dim 0."""
    return _check("ring_all_gather", student_fn, "all_gather", world_size, numel, 1,
                  ["some chunks are missing or wrong: after n-1 steps every rank must have seen every "
                   "other rank's chunk",
                   "at step k rank r forwards to rank r+1 the chunk it received at step k-1 (at step "
                   "0, its own); the chunk received at step k started on rank r-k-1",
                   "out[r] = x; at step k send out[(r-k) % n] right and store what arrives in "
                   "out[(r-k-1) % n]; return the concatenation"],
                  ["too many bytes: a ring forwards one chunk per step",
                   "forward one chunk per step to your right neighbour only, n-1 steps"],
                  timeout, backend)

"""Checks for the Collectives lab: a ring all-reduce and a ring all-gather built from send/recv.

Inputs are integers stored as float64, so any summation order gives the exact same result and
"equal to dist.all_reduce" can be checked exactly. The checks also read the bytes the student's
code sent (``group.stats``) and compare them with the ring algorithm's volume.
"""
from __future__ import annotations

from . import describe_mismatch, report, run_student


def _worker(student_fn, op: str, numel: int, seed: int):
    import torch
    import torch.distributed as dist

    from labkit import comm
    from labkit.groups import world_group

    group = world_group()
    gen = torch.Generator().manual_seed(seed + dist.get_rank())
    x = torch.randint(-100, 100, (numel,), generator=gen).double()
    before = x.clone()
    got = student_fn(group, x)
    sent = group.stats.bytes.get("send", 0.0)
    reference_group = world_group()  # fresh counters: keep the reference out of the student's bytes
    expected = comm.all_reduce(reference_group, x) if op == "all_reduce" else comm.all_gather(reference_group, x)
    return {"got": None if got is None else got.detach(), "expected": expected,
            "sent": sent, "input_changed": not torch.equal(x, before), "nbytes": x.numel() * 8}


def _check(name, student_fn, op, world_size, numel, ideal_factor, hint_values, hint_bytes):
    results, failed = run_student(name, _worker, world_size, student_fn, op, numel, 0)
    if failed is not None:
        return failed
    title = f"{name} ({world_size} ranks)"
    for r, out in enumerate(results):
        if out["got"] is None:
            return report(title, False, f"rank {r} returned None", "return the result tensor")
        problem = describe_mismatch(out["got"], out["expected"], what=f"rank {r}, ")
        if problem:
            return report(title, False, problem, hint_values)
    n, N = world_size, results[0]["nbytes"] * (world_size if op == "all_gather" else 1)
    ideal = ideal_factor * (n - 1) / n * N
    for r, out in enumerate(results):
        if abs(out["sent"] - ideal) > 0.5:
            return report(title, False, f"rank {r} sent {out['sent']:.0f} bytes; a ring sends "
                          f"{ideal:.0f} ({ideal_factor}(n-1)/n x {N} bytes)", hint_bytes)
    note = " (it also changed its input in place)" if any(o["input_changed"] for o in results) else ""
    return report(title, True, f"equals dist.{op} exactly and each rank sent {ideal:.0f} bytes, "
                  f"the ring's {ideal_factor}(n-1)/n x N{note}")


def ring_all_reduce(student_fn, world_size: int = 4, numel: int = 24):
    """``student_fn(group, x) -> sum of x over ranks``, using labkit.comm.send/recv/send_recv only."""
    return _check("ring_all_reduce", student_fn, "all_reduce", world_size, numel, 2,
                  "phase 1 (reduce-scatter): n-1 steps, each rank ADDS the chunk it receives; "
                  "phase 2 (all-gather): n-1 steps, each rank COPIES the chunk it receives",
                  "send one chunk (N/n) per step, 2(n-1) steps; use labkit.comm.send_recv")


def ring_all_gather(student_fn, world_size: int = 4, numel: int = 6):
    """``student_fn(group, x) -> concatenation of every rank's x``, in rank order, along dim 0."""
    return _check("ring_all_gather", student_fn, "all_gather", world_size, numel, 1,
                  "at step k rank r forwards the chunk it received at step k-1 to rank r+1; "
                  "place the chunk from rank j at position j",
                  "send each chunk once per step, n-1 steps")

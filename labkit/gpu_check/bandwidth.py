"""NCCL bandwidth of all-reduce, all-gather and reduce-scatter over message sizes, as nccl-tests reports it.

Definitions of NVIDIA's nccl-tests (doc/PERFORMANCE.md, github.com/NVIDIA/nccl-tests at a0b82b22):
``S`` is the size of the whole array (the all-reduce buffer; the all-gather OUTPUT; the
reduce-scatter INPUT, i.e. n times the per-rank shard), ``t`` the time of one operation averaged
over the ranks (nccl-tests' default, ``-a 1``), and

    algbw = S / t                     (algorithm bandwidth)
    busbw = algbw * 2(n-1)/n          all-reduce
    busbw = algbw * (n-1)/n           all-gather, reduce-scatter

Bus bandwidth is comparable with the hardware's per-GPU link speed whatever n is; it equals the
bytes one rank sends under the ring algorithms (``labkit.calc.comm``) divided by ``t``. Buffers
are fp32; each size runs ``warmup`` times untimed, then ``iters`` times between two synchronized
clock reads (``launcher.timer``), after a barrier.
"""
from __future__ import annotations

OPS = ("all_reduce", "all_gather", "reduce_scatter")
SIZES = tuple(2**20 * 4**k for k in range(6))   # 1 MiB ... 1 GiB


def bus_factor(op: str, n: int) -> float:
    """nccl-tests' correction from algorithm to bus bandwidth for ``n`` ranks."""
    if op not in OPS:
        raise ValueError(f"op must be one of {OPS}, got {op!r}")
    return (2 if op == "all_reduce" else 1) * (n - 1) / n


def bandwidths(op: str, size_bytes: float, seconds: float, n: int) -> dict:
    """{"algbw", "busbw"} in bytes/s for one operation on ``size_bytes`` (S) in ``seconds``."""
    if seconds <= 0 or size_bytes <= 0:
        raise ValueError(f"need size > 0 and time > 0, got {size_bytes}, {seconds}")
    alg = size_bytes / seconds
    return {"algbw": alg, "busbw": alg * bus_factor(op, n)}


def measure(sizes, warmup: int, iters: int) -> list:
    """Runs in every rank (NCCL): this rank's time per operation for each op and size."""
    import torch
    import torch.distributed as dist

    from ..launcher import device, timer
    n, dev, rows = dist.get_world_size(), device(), []
    for op in OPS:
        for size in sizes:
            numel = max(n, size // 4 // n * n)              # fp32 elements, a multiple of n
            full = torch.zeros(numel, device=dev)           # S bytes: the array nccl-tests sizes
            shard = torch.zeros(numel // n, device=dev)     # one rank's part
            call = {"all_reduce": lambda: dist.all_reduce(full),
                    "all_gather": lambda: dist.all_gather_into_tensor(full, shard),
                    "reduce_scatter": lambda: dist.reduce_scatter_tensor(shard, full)}[op]
            for _ in range(warmup):
                call()
            dist.barrier()
            with timer() as t:
                for _ in range(iters):
                    call()
            rows.append((op, numel * 4, t.seconds / iters))
            del full, shard
    return rows


def summarize(per_rank: list, n: int) -> list:
    """Report rows from every rank's ``measure`` output: time averaged over ranks, then bandwidths."""
    rows = []
    for i, (op, size, _) in enumerate(per_rank[0]):
        seconds = sum(r[i][2] for r in per_rank) / len(per_rank)
        rows.append({"op": op, "bytes": size, "ranks": n, "seconds": seconds,
                     **bandwidths(op, size, seconds, n)})
    return rows


def run(n: int, sizes=SIZES, warmup: int = 5, iters: int = 20, backend: str = "nccl",
        say=print) -> list:
    """Measure on ``n`` GPUs, one rank each (``backend="gloo"``: CPU ranks, for the tests)."""
    from ..launcher import launch
    say(f"gpu-check: {backend} bandwidth on {n} ranks, {len(sizes)} sizes x {len(OPS)} collectives ...")
    rows = summarize(launch(measure, n, list(sizes), warmup, iters, backend=backend, timeout=1800), n)
    for op in OPS:
        best = max(r["busbw"] for r in rows if r["op"] == op)
        say(f"gpu-check: {op}: best bus bandwidth {best / 1e9:.1f} GB/s")
    return rows

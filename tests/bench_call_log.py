"""What the call log (``Group.log``, the ring buffer labkit.comm fills) costs: a benchmark.

    PYTHONPATH=. python tests/bench_call_log.py [--calls 2000]

1. In one process: ``CallLog.add`` alone (two clock reads and a list store), per call.
2. On 2 gloo ranks: ``comm.all_reduce`` of 1 float, with the log on and off (``group.log = None``),
   interleaved in rounds; the difference of the medians, per call and relative to the call. A
   1-float all-reduce is the worst case: the call itself is as cheap as a collective gets.
"""
from __future__ import annotations

import argparse
import statistics
import time


def add_cost(n: int = 200_000) -> float:
    from labkit.groups import CallLog
    log = CallLog()
    t = time.perf_counter()
    for _ in range(n):
        log.add("all_reduce", 0.0, 4)
    return (time.perf_counter() - t) / n


def _ranks(calls: int, rounds: int) -> dict:
    import torch

    from labkit import comm
    from labkit.groups import CallLog, world_group
    g, x, out = world_group(), torch.ones(1), {"on": [], "off": []}
    for _ in range(50):
        comm.all_reduce(g, x)                       # warm
    for _ in range(rounds):
        for mode in ("on", "off"):
            g.log = CallLog() if mode == "on" else None
            t = time.perf_counter()
            for _ in range(calls):
                comm.all_reduce(g, x)
            out[mode].append((time.perf_counter() - t) / calls)
    return out


def main() -> None:
    import labkit
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=5)
    a = p.parse_args()
    print(f"CallLog.add alone: {add_cost() * 1e6:.2f} us per call")
    got = labkit.launch(_ranks, 2, a.calls, a.rounds, backend="gloo")[0]
    on, off = statistics.median(got["on"]), statistics.median(got["off"])
    print(f"comm.all_reduce of 1 float on 2 gloo ranks: log on {on * 1e6:.1f} us, off {off * 1e6:.1f} us per call; "
          f"difference {(on - off) * 1e6:+.2f} us ({(on - off) / off * 100:+.1f}%), rounds on {[round(v * 1e6, 1) for v in got['on']]} "
          f"off {[round(v * 1e6, 1) for v in got['off']]}")


if __name__ == "__main__":
    main()

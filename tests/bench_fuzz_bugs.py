"""Benchmark: how many drawn layouts the fuzzer needs to find each planted composition bug, from a
cold start, over seeds 0-4 (issue 31, "the bugs' median budget to be found").

    PYTHONPATH=. python tests/bench_fuzz_bugs.py [--seeds 0-4] [--budget 120] [--out data/fuzz_bug_budgets.json]

Each run is ``labkit.fuzz.fuzz(seed, layouts=budget, bug=name, stop_at_first=True)``: a full fuzz
(every drawn layout refused by a named rule or trained and judged against one device) with the bug
planted in every labkit run, stopped at the first finding. Its figure is the index of that layout
among the layouts drawn (refused ones included): a count, so it does not depend on the machine's
load; the seconds do. A bug not found within ``budget`` layouts is recorded as not found (the
median then reads "> budget" if half the seeds miss). The pool a seed draws depends on the budget
too (Hypothesis's seeded stream is not prefix-stable), so the budget is part of the result. No
shrinking and no diverge here: tests/test_fuzz_bugs.py proves those for each bug on fixed seeds.
The run resumes: seeds already in ``--out`` (same budget) are not run again.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("LABKIT_BACKEND", "gloo")

from labkit.debug.composition import NAMES  # noqa: E402
from labkit.fuzz.run import fuzz  # noqa: E402


def seeds_of(text: str) -> list[int]:
    lo, _, hi = text.partition("-")
    return list(range(int(lo), int(hi or lo) + 1))


def median_text(found: list, budget: int) -> str:
    """The median of the indices, a miss counting as above the budget."""
    vals = sorted(budget + 1 if f is None else f for f in found)
    m = statistics.median(vals)
    return f"> {budget}" if m > budget else f"{m:g}"


def provenance(argv) -> dict:
    """Where and how the figures were made (the counts do not depend on the machine; the seconds do)."""
    import platform
    import subprocess

    import torch
    root = Path(__file__).resolve().parents[1]
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True).stdout.strip()
    return {"command": "python tests/bench_fuzz_bugs.py " + " ".join(argv or sys.argv[1:]), "labkit_commit": commit,
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "machine": f"{platform.machine()} {platform.system()}, {os.cpu_count()} CPUs, torch {torch.__version__}, gloo"}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", default="0-4")
    ap.add_argument("--budget", type=int, default=120)
    ap.add_argument("--bugs", default=",".join(NAMES))
    ap.add_argument("--out", default="data/fuzz_bug_budgets.json")
    args = ap.parse_args(argv)
    out = Path(args.out)
    record = json.loads(out.read_text()) if out.exists() else {}
    if record.get("budget", args.budget) != args.budget:
        record = {}
    record.update(budget=args.budget, runs=record.get("runs", {}), provenance=record.get("provenance") or provenance(argv))
    for name in args.bugs.split(","):
        for seed in seeds_of(args.seeds):
            key = f"{name}/{seed}"
            if key in record["runs"]:
                continue
            t0 = time.perf_counter()
            r = fuzz(seed=seed, layouts=args.budget, bug=name, stop_at_first=True, shrink=False, diverge=False)
            c = r.counts()
            record["runs"][key] = {"found_at": r.findings[0].index if r.findings else None,
                                   "drawn": c["drawn"], "run": c["drawn"] - c.get("refused", 0),
                                   "seconds": round(time.perf_counter() - t0, 1)}
            out.write_text(json.dumps(record, indent=1) + "\n")
            print(f"{key:45s} {record['runs'][key]}", flush=True)
    print(f"\nbudget {args.budget} layouts; found at (layouts drawn), seeds {args.seeds}:")
    for name in args.bugs.split(","):
        found = [record["runs"][f"{name}/{s}"]["found_at"] for s in seeds_of(args.seeds)]
        print(f"  {name:40s} {found}  median {median_text(found, args.budget)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

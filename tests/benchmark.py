"""Benchmarks for the README (not a test: nothing here asserts a time).

    python tests/benchmark.py                 launch overhead + every notebook's execution time
    python tests/benchmark.py --pytest        ... plus the wall time of the README's test command

Budgets (DESIGN.md), on the 2-core CI machine: launch of 8 gloo ranks <= 6 s overhead; each
notebook <= 90 s; the whole pytest <= 10 min. Prints a Markdown table; exits 0 whatever it measures.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

COLD = """
import time; t0 = time.perf_counter()
import labkit
def noop():
    return 0
labkit.launch(noop, {n})
t1 = time.perf_counter()
labkit.launch(noop, {n})
t2 = time.perf_counter()
print(t1 - t0, t2 - t1)
"""


def launch_overhead(sizes=(1, 2, 4, 8), repeats=3):
    """(cold, warm) seconds per world size. Cold: a fresh Python process, including `import torch`
    and starting the forkserver; warm: a second launch in the same process."""
    rows = []
    for n in sizes:
        cold, warm = [], []
        for _ in range(repeats):
            out = subprocess.run([sys.executable, "-c", COLD.format(n=n)], capture_output=True,
                                 text=True, cwd=ROOT, check=True)
            c, w = map(float, out.stdout.split())
            cold.append(c)
            warm.append(w)
        rows.append((n, min(cold), min(warm)))
    return rows


def notebook_times():
    sys.path.insert(0, str(ROOT))
    import nbformat
    from labkit.notebooks import all_notebooks, execute
    rows = []
    for path in all_notebooks():
        nb = nbformat.read(path, as_version=4)
        t0 = time.perf_counter()
        try:
            execute(nb, path)
            ok = "ok"
        except Exception as e:  # noqa: BLE001 - report, keep measuring the others
            ok = f"error: {type(e).__name__}"
        rows.append((str(path.relative_to(ROOT)), time.perf_counter() - t0, ok))
    return rows


def pytest_time():
    """(seconds, summary line, the 25 slowest test phases as pytest reports them)."""
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadscope", "--nbval", "-q",
                          "--durations=25"], cwd=ROOT, capture_output=True, text=True)
    lines = out.stdout.strip().splitlines()
    tail = lines[-1] if lines else out.stderr[-300:]
    slow = [ln for ln in lines if ln[:1].isdigit() and "s " in ln and ("call" in ln or "setup" in ln)]
    return time.perf_counter() - t0, tail, slow


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pytest", action="store_true", help="also time the whole test suite")
    ap.add_argument("--skip-notebooks", action="store_true")
    args = ap.parse_args()
    results = {"launch": launch_overhead()}
    print("| gloo ranks | cold launch (s, incl. import torch) | warm launch (s) |\n|---:|---:|---:|")
    for n, c, w in results["launch"]:
        print(f"| {n} | {c:.2f} | {w:.2f} |")
    if not args.skip_notebooks:
        results["notebooks"] = notebook_times()
        print("\n| notebook | execution (s) | result |\n|---|---:|---|")
        for p, s, ok in results["notebooks"]:
            print(f"| {p} | {s:.1f} | {ok} |")
    if args.pytest:
        results["pytest"] = pytest_time()
        print(f"\nwhole pytest (-n 2 --nbval): {results['pytest'][0]:.0f} s ({results['pytest'][1]})")
        print("slowest:\n" + "\n".join(results["pytest"][2]))
    out = ROOT / "bench_results"
    out.mkdir(exist_ok=True)
    (out / "benchmark.json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Benchmark: grade every lab of _toc.yml, its master (a solved submission) and its student copy.

    python tests/bench_grading.py [--out grading-times.md] [--sandbox bwrap|none] [lab-name ...]

For each lab, the grader (``python -m labkit.notebooks grade``, one process per lab, as an instructor
runs it) grades the master and the student copy with every hidden case, and the table says the
points each got (the master must get full marks, the student copy zero) and the seconds each took
(the grader's own ``seconds``: extraction, the sandboxed runs and the judging). Not a test: times
depend on the machine and its load, which the output states.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def toc_labs() -> list[str]:
    return [line.split("labs/")[1].strip() for line in (ROOT / "_toc.yml").read_text().splitlines()
            if line.strip().startswith("- file: labs/")]


def grade(lab: str, tmp: Path, sandbox: list) -> dict:
    master = ROOT / "solutions" / f"{lab}.ipynb"
    subs = [tmp / f"master-{lab}.ipynb", tmp / f"student-{lab}.ipynb"]
    shutil.copyfile(master, subs[0])
    shutil.copyfile(ROOT / "labs" / f"{lab}.ipynb", subs[1])
    out = subprocess.run([sys.executable, "-m", "labkit.notebooks", "grade", *map(str, subs), "--master", str(master),
                          "--json", "--out", str(tmp / "grades" / lab), *sandbox],
                         capture_output=True, text=True, cwd=ROOT, timeout=1800)
    rows = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    if len(rows) != 2:
        raise RuntimeError(f"{lab}: the grader said {out.stderr[-2000:]}")
    ms, st = rows
    checked = sorted({x["checked"] for x in ms["exercises"]})
    cases = sum(len(x["cases"]) for x in ms["exercises"])
    hidden = sum(c["hidden"] for x in ms["exercises"] for c in x["cases"])
    return {"lab": lab, "exercises": len(ms["exercises"]), "max_points": ms["max_points"],
            "master": ms["points"], "student": st["points"], "master_s": ms["seconds"], "student_s": st["seconds"],
            "cases": cases, "hidden": hidden, "checked": "/".join(checked),
            "failing": [f"{x['id']}: {x['message'][:200]}" for x in ms["exercises"] if x["status"] != "pass"]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("labs", nargs="*")
    ap.add_argument("--out", default="")
    ap.add_argument("--sandbox", default="bwrap", choices=["bwrap", "none"])
    args = ap.parse_args(argv)
    sandbox = ["--sandbox", "none", "--unsafe-no-sandbox"] if args.sandbox == "none" else []
    load = os.getloadavg()[0]
    lines = [f"sandbox {args.sandbox}, {os.cpu_count()} cores, load average {load:.1f} at the start", "",
             "| lab | exercises (points) | cases (hidden) | checked | master: points, s | student copy: points, s |",
             "|---|---|---|---|---|---|"]
    with tempfile.TemporaryDirectory(prefix="bench-grading-") as tmp:
        for lab in args.labs or toc_labs():
            r = grade(lab, Path(tmp), sandbox)
            lines.append(f"| {lab} | {r['exercises']} ({r['max_points']}) | {r['cases']} ({r['hidden']}) | {r['checked']} "
                         f"| {r['master']:g}/{r['max_points']}, {r['master_s']:.0f} s "
                         f"| {r['student']:g}/{r['max_points']}, {r['student_s']:.0f} s |")
            print(lines[-1], *r["failing"], sep="\n  ", flush=True)
    lines.append(f"\nload average {os.getloadavg()[0]:.1f} at the end")
    text = "\n".join(lines)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

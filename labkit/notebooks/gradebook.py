"""Grade a class: every submission against one master; a JSON file and a CSV gradebook.

    grades/X.json   {"master": PATH, "exercises": [{"id", "max_points"}], "submissions": [ONE, ...]}
    grades/X.csv    submission,<exercise id>...,points,max_points   (one row per notebook, points)

ONE is the object ``--json`` prints, one line per submission:
    {"submission": PATH, "points": N, "max_points": N, "exercises": [{"id": ..., "status":
     "pass"|"fail"|"error"|"timeout"|"missing", "points": N, "max_points": N, "message": ...}]}
"""
from __future__ import annotations

import csv
import json
from pathlib import Path

from .grader import grade_one
from .schema import exercises
from .validation import validate


class MasterError(ValueError):
    """The master cannot be graded against (not valid, or not refreshed)."""


def load_master(path):
    import nbformat
    nb = nbformat.read(str(path), as_version=4)
    problems = validate(nb, kind="master")
    if problems:
        raise MasterError(f"{path} is not a valid master:\n  " + "\n  ".join(problems))
    if not exercises(nb):
        raise MasterError(f"{path} has no check cell (metadata labkit role 'check')")
    return nb


def grade(submissions, master_path, out_dir="grades", timeout: float = 300.0, on_result=None) -> list[dict]:
    """Grade each submission; write ``out_dir``/<master>.json and .csv; return the results."""
    master_path = Path(master_path)
    master = load_master(master_path)
    results = []
    for path in submissions:
        results.append(grade_one(master, master_path, path, timeout))
        if on_result:
            on_result(results[-1])
    if out_dir is not None:
        write(results, master, master_path, Path(out_dir))
    return results


def write(results, master, master_path: Path, out_dir: Path) -> tuple[Path, Path]:
    exs = exercises(master)
    out_dir.mkdir(parents=True, exist_ok=True)
    jpath, cpath = out_dir / f"{master_path.stem}.json", out_dir / f"{master_path.stem}.csv"
    jpath.write_text(json.dumps({"master": str(master_path),
                                 "exercises": [{"id": e.id, "max_points": e.max_points} for e in exs],
                                 "submissions": results}, indent=1) + "\n")
    with open(cpath, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["submission", *[e.id for e in exs], "points", "max_points"])
        for r in results:
            pts = {x["id"]: x["points"] for x in r["exercises"]}
            w.writerow([r["submission"], *[pts[e.id] for e in exs], r["points"], r["max_points"]])
    return jpath, cpath


def human(result: dict) -> str:
    """A submission's result as text: a total line, then one line per exercise."""
    lines = [f"{result['submission']}: {result['points']}/{result['max_points']} points"]
    width = max((len(x["id"]) for x in result["exercises"]), default=0)
    for x in result["exercises"]:
        head = f"  {x['status'].upper():8} {x['id']:{width}} {x['points']}/{x['max_points']}  "
        lines.append(head + x["message"].replace("\n", "\n" + " " * len(head)))
    return "\n".join(lines)

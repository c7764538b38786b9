"""``python -m labkit.notebooks run-autograder``: the same grader inside Gradescope's autograder.

Gradescope runs ``/autograder/run_autograder`` for each submission, with the student's files in
``/autograder/submission`` and the autograder zip unpacked in ``/autograder/source``, and reads
``/autograder/results/results.json`` (Gradescope, "Autograder Specifications",
https://gradescope-autograders.readthedocs.io/en/latest/specs/). This writes it: the total score,
one test per exercise with its partial credit and the check's message; the hidden cases are
counted in the score and shown only "after_published" (``book/instructors.md`` has the zip's
``setup.sh`` and ``run_autograder``).
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path


def find_submission(folder: Path, master_path: Path) -> Path | None:
    """The notebook to grade: the one named like the master, else the only ``.ipynb`` there."""
    notebooks = sorted(p for p in Path(folder).rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts)
    named = [p for p in notebooks if p.name == Path(master_path).name]
    return named[0] if named else (notebooks[0] if len(notebooks) == 1 else None)


def results_json(result: dict | None, seconds: float, problem: str = "") -> dict:
    """Gradescope's results.json for one graded submission (or for a problem that stopped it)."""
    if result is None:
        return {"score": 0.0, "execution_time": round(seconds), "output": problem, "tests": []}
    tests = []
    for x in result["exercises"]:
        visible = [c for c in x.get("cases", []) if not c["hidden"]]
        hidden = [c for c in x.get("cases", []) if c["hidden"]]
        lines = [f"{'PASS' if c['passed'] else 'FAIL'} {c['message']}" for c in visible] or [x["message"]]
        tests.append({"name": x["id"], "score": x["points"], "max_score": x["max_points"],
                      "status": "passed" if x["status"] == "pass" else "failed",
                      "output": "\n".join(lines)[:8000], "visibility": "visible"})
        if hidden:
            tests.append({"name": f"{x['id']}: hidden cases", "score": 0.0, "max_score": 0.0,
                          "status": "passed" if all(c["passed"] for c in hidden) else "failed",
                          "output": (f"{sum(c['passed'] for c in hidden)} of {len(hidden)} hidden cases pass "
                                     "(counted in the exercise's score)\n" + "\n".join(
                                         f"{'PASS' if c['passed'] else 'FAIL'} {c.get('detail', '')}"
                                         for c in hidden))[:8000], "visibility": "after_published"})
    flags = "; ".join(f"{f['where']} {f['what']}" for f in result.get("flags", []))
    return {"score": result["points"], "execution_time": round(seconds),
            "output": f"{result['points']:g} of {result['max_points']} points", "tests": tests,
            "extra_data": {"flags": flags, "sandbox": result.get("sandbox", "")}, "stdout_visibility": "hidden"}


def run_autograder(master_path, submission_dir="/autograder/submission",
                   results_path="/autograder/results/results.json", opts=None, hidden_path=None) -> dict:
    from .gradebook import MasterError, hidden_file, load_hidden, load_master
    from .grader import Options, grade_one
    from .preflight import SetupError
    t0 = time.monotonic()
    opts = opts or Options()
    try:
        master = load_master(master_path)
        if not opts.hidden:
            opts.hidden = load_hidden(Path(master_path), hidden_path)
        if opts.check_master:
            from .integrity import Fingerprint
            from .preflight import check_master
            trusted = [Path(master_path)] + [p for p in [hidden_file(Path(master_path), hidden_path)] if p.exists()]
            check_master(master, Path(master_path), opts, Fingerprint.of(opts.sandbox.labkit_root, *trusted))
        path = find_submission(Path(submission_dir), Path(master_path))
        if path is None:
            out = results_json(None, time.monotonic() - t0, f"no notebook to grade in the submission: upload "
                               f"{Path(master_path).name}")
        else:
            out = results_json(grade_one(master, Path(master_path), path, opts), time.monotonic() - t0)
    except (MasterError, SetupError) as e:
        out = results_json(None, time.monotonic() - t0, f"the autograder is misconfigured: {e}")
    Path(results_path).parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(results_path).with_suffix(".tmp")
    tmp.write_text(json.dumps(out, indent=1))
    os.replace(tmp, results_path)
    return out

"""Grade one submission against its master (``python -m labkit.notebooks grade``).

For each exercise of the master, in a fresh folder holding only a copy of the submission:

1. **Extract** the answer cells up to the exercise's check (``answers.jobs``): the student's code,
   nothing else of the notebook. Locked cells (demos, checks) are never run.
2. **Run** them in a sandbox (``sandbox.run_job``: bubblewrap by default), in a fresh process
   (``labkit.check.runner``) that bans labkit's implementation of the exercise and installs the
   counting process group *before* the source runs, then runs each case's ``produce``: the
   visible cases of the check cell and the hidden ones (other shapes, world sizes, seeds), read by
   the grader from a file the sandbox does not mount. Each answer cell and each case has
   ``timeout`` seconds; a timeout, a crash or a kill costs only this exercise.
3. **Judge** here, in the grader's process, where no submission code runs: each case's data
   (JSON, never a pickle) against the exercise's independent reference (``Spec.judge``).

Points are partial: ``max_points`` x the share of the exercise's cases that pass (status "pass"
when all do, "partial" when some do). A lab check that is not a ``labkit.check`` Spec is graded the
older way inside the sandbox (its check cell runs after the answers, in the same process) and
reported with ``"checked": "in-process"``: a submission can tamper with that one.
"""
from __future__ import annotations

import contextlib
import io
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from .answers import flags, jobs
from .events import clean
from .sandbox import Sandbox, run_job
from .schema import Exercise, exercises

STATUSES = ("pass", "partial", "fail", "error", "timeout", "missing")
MAX_NOTEBOOK = 32 * 2**20


@dataclass
class Options:
    sandbox: Sandbox = field(default_factory=Sandbox)
    timeout: float = 60.0                 # seconds per answer cell and per check case
    hidden: dict = field(default_factory=dict)     # exercise id -> [case dicts]
    workdir: str | None = None            # where the per-submission folders are made
    keep: bool = False                    # keep them (to debug a grading problem)
    check_master: bool = True             # grade the master first, refuse unless full marks (preflight)


def _case_result(spec, case: dict, hidden: bool, event) -> dict:
    from labkit.check import wire
    name = "hidden case" if hidden else "case"
    if event is None:
        return {"name": name, "hidden": hidden, "passed": False, "message": "did not run"}
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            r = spec.judge(wire.decode(event["data"]), **case)
        return {"name": r.name if not hidden else f"hidden: {r.name}", "hidden": hidden, "passed": r.passed,
                "message": r.message + (f"\nhint: {r.hint}" if r.hint and not r.passed else "")}
    except Exception as e:  # noqa: BLE001 - malformed data from the sandbox, or a judge bug
        return {"name": name, "hidden": hidden, "passed": False,
                "message": f"the check could not read what your code produced ({type(e).__name__}: "
                           f"{str(e)[:200]})"}


def _notes(outcome, timeout: float, earlier=frozenset()) -> list[str]:
    """What went wrong around the check: answer cells that raised (those an earlier exercise's job
    ran too are that exercise's to report), a timeout, a dead process, a broken protocol."""
    cells = next((e for e in outcome.events if e.get("event") == "cells"), None)
    errors = [(where, err) for where, err in (cells or {}).get("errors", []) if where not in earlier]
    notes = [f"{where} raised {err}" for where, err in errors[:3]]
    if outcome.state == "timeout":
        notes.append(f"{outcome.detail} did not finish within {timeout:g} s")
    elif outcome.state == "died":
        notes.append(f"the process running your code died ({outcome.detail}: killed, out of memory or "
                     "CPU time, or os._exit)")
    elif outcome.state == "protocol":
        notes.append(f"the process running your code broke the grader's protocol ({outcome.detail})")
    return notes


def _score(ex: Exercise, cases: list, notes: list, outcome, checked: str) -> dict:
    passed = sum(c["passed"] for c in cases)
    total = max(1, len(cases))
    if passed == len(cases) and cases:
        status = "pass"
    elif passed:
        status = "partial"
    elif outcome.state == "timeout":
        status = "timeout"
    elif outcome.state in ("died", "protocol") or not cases:
        status = "error"
    else:
        status = "fail"
    first = next((c for c in cases if not c["passed"]), None)
    if status == "pass":
        msg = "; ".join(c["message"] for c in cases if not c["hidden"]) or "all cases pass"
    else:
        msg = (first["message"] if first and first["message"] != "did not run" else "the check did not run")
        msg = "; ".join(notes) + "; then " + msg if notes else msg
    return {"id": ex.id, "status": status, "points": round(ex.max_points * passed / total, 2),
            "max_points": ex.max_points, "message": clean(msg, 4000), "checked": checked,
            "cases": [{**c, "name": clean(c["name"], 200), "message": clean(c["message"])} for c in cases]}


def _legacy(ex: Exercise, outcome, timeout: float, earlier=frozenset()) -> dict:
    """An in-process check: its printed [check] lines, as many as the master's stored output, all PASS."""
    from .schema import check_lines
    ev = next((e for e in outcome.events if e.get("event") == "legacy"), {})
    lines = check_lines(str(ev.get("stdout", "")))[:50]
    cases = [{"name": x.text.split(":")[0][:200], "hidden": False, "passed": x.passed,
              "message": x.text[:2000] + (f"\nhint: {x.hint}" if x.hint and not x.passed else "")} for x in lines]
    if len(cases) < ex.expected or ev.get("error"):
        cases.append({"name": "the check cell", "hidden": False, "passed": False,
                      "message": f"the check raised {ev['error']}" if ev.get("error") else
                      f"the check reported {len(lines)} of {ex.expected} results"})
    result = _score(ex, cases, _notes(outcome, timeout, earlier), outcome, "in-process")
    if result["status"] == "partial":            # an in-process check is all or nothing
        result["status"], result["points"] = "fail", 0
    return result


def _stuck_cell(outcome) -> str:
    """The answer cell the process was running when it timed out or died ("" if none was)."""
    if outcome.state not in ("timeout", "died") or not outcome.events:
        return ""
    last = outcome.events[-1]
    return last.get("where", "") if last.get("event") == "cell" else ""


def grade_exercise(job, folder: Path, notebook: Path, opts: Options, skip: dict | None = None,
                   earlier=frozenset()) -> tuple[dict, str]:
    """Run one exercise's job in ``folder`` (a fresh copy of the submission there) and judge it.
    ``skip``: {cell: why} answer cells that hung or crashed an earlier exercise's run, left out;
    ``earlier``: the answer cells earlier exercises' jobs ran (their errors are reported there).
    Returns (result, the answer cell this run got stuck in or "")."""
    from labkit.check.registry import find
    ex, skip = job.exercise, skip or {}
    folder.mkdir()
    shutil.copyfile(notebook, folder / "submission.ipynb")
    spec = find(ex.id)
    answers = [list(a) for a in job.answers if a[0] not in skip]
    payload = {"exercise": ex.id, "setup": job.setup, "answers": answers}
    skipped = [f"{where} was left out ({why})" for where, why in skip.items()
               if any(a[0] == where for a in job.answers)]
    if spec is None:
        outcome = run_job(opts.sandbox, folder, {**payload, "check_cell": ex.check_source}, opts.timeout)
        return _legacy(ex, outcome, opts.timeout, earlier), _stuck_cell(outcome)
    cases = [(dict(c), False) for c in spec.cases] + [(dict(c), True) for c in opts.hidden.get(ex.id, [])]
    outcome = run_job(opts.sandbox, folder, {**payload, "cases": [c for c, _ in cases]}, opts.timeout)
    return judge_outcome(ex, spec, cases, outcome, opts.timeout, skipped, earlier), _stuck_cell(outcome)


def judge_outcome(ex: Exercise, spec, cases: list, outcome, timeout: float, skipped=(), earlier=frozenset()) -> dict:
    """The exercise's result from what its run sent (``outcome.events``, parsed by ``events.parse``)."""
    data = {e["index"]: e for e in outcome.events if e["event"] == "data"}
    judged = [_case_result(spec, case, hidden, data.get(k)) for k, (case, hidden) in enumerate(cases)]
    return _score(ex, judged, [*skipped, *_notes(outcome, timeout, earlier)], outcome, "isolated")


def _summary(path, results, extra=None) -> dict:
    return {"submission": str(path), "points": round(sum(r["points"] for r in results), 2),
            "max_points": sum(r["max_points"] for r in results), "exercises": results, **(extra or {})}


def _broken(ex: Exercise, e: BaseException) -> dict:
    return {"id": ex.id, "status": "error", "points": 0, "max_points": ex.max_points, "checked": "none",
            "message": clean(f"the grader could not grade this exercise ({type(e).__name__}: {e})", 600),
            "cases": []}


def _missing(ex: Exercise, message: str) -> dict:
    return {"id": ex.id, "status": "missing", "points": 0, "max_points": ex.max_points, "message": message,
            "checked": "none", "cases": []}


def grade_one(master, master_path: Path, path, opts: Options | None = None) -> dict:
    """Grade one submission; returns its result (the JSON object of one gradebook row)."""
    import nbformat
    opts = opts or Options()
    exs, t0 = exercises(master), time.monotonic()
    try:
        if Path(path).stat().st_size > MAX_NOTEBOOK:
            raise ValueError(f"larger than {MAX_NOTEBOOK // 2**20} MiB")
        sub = nbformat.read(str(path), as_version=4)
    except Exception as e:  # noqa: BLE001 - an unreadable file is reported, not raised
        return _summary(path, [_missing(ex, f"could not read the notebook: {str(e)[:200]}") for ex in exs])
    if not {c.get("id") for c in sub.cells} & {c.get("id") for c in master.cells}:
        return _summary(path, [_missing(ex, "no cell id of the master found: is this a copy of "
                                        f"{Path(master_path).name}, saved with its cell ids?") for ex in exs])
    todo = jobs(master, sub)
    if opts.workdir:
        Path(opts.workdir).mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="labkit-grade-", dir=opts.workdir)).resolve()
    try:
        notebook = tmp / "submission.ipynb"
        shutil.copyfile(path, notebook)
        results, skip, earlier = [], {}, set()
        for job in todo:                 # a cell that hung or crashed one exercise is left out of the next
            try:
                result, stuck = grade_exercise(job, tmp / job.exercise.id, notebook, opts, skip, frozenset(earlier))
            except Exception as e:  # noqa: BLE001 - whatever went wrong is this exercise's error, never the run's
                result, stuck = _broken(job.exercise, e), ""
            earlier |= {where for where, _ in job.answers}
            results.append(result)
            if stuck:
                skip[stuck] = f"it did not finish or crashed while {job.exercise.id} was graded"
    finally:
        if not opts.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    answers = todo[-1].answers if todo else []
    return _summary(path, results, {"flags": flags(answers), "sandbox": opts.sandbox.kind,
                                    "seconds": round(time.monotonic() - t0, 1)})

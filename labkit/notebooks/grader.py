"""Grade one submission against its master (``python -m labkit.notebooks grade``).

For each exercise of the master, in a fresh folder holding only a copy of the submission:

1. **Extract** the answer cells up to the exercise's check (``answers.jobs``): the student's code,
   nothing else of the notebook. Locked cells (demos, checks) are never run.
2. **Run** them in a sandbox (``sandbox.run_job``: bubblewrap by default), in a fresh process
   (``labkit.check.runner``) that bans labkit's implementation of the exercise and installs the
   counting process group *before* the source runs, then runs each case's ``produce``: the
   visible cases of the check cell in one run, each hidden one (other shapes, world sizes, seeds,
   read by the grader from a file the sandbox does not mount) alone in a run of its own. Each
   answer cell and each case has ``timeout`` seconds, the whole submission ``Options.budget()``;
   a timeout, a crash, a kill or a broken line (``events.parse``) costs only this exercise.
3. **Judge** here, in the grader's process, where no submission code runs: each case's data
   (JSON, never a pickle) against the exercise's independent reference (``Spec.verdict``: plain,
   finite data of the case's size first, then ``Spec.judge``). A hidden case's message says only
   pass or fail; what the check said is its ``detail``, shown once grades are published.

Points are partial: ``max_points`` x the share of the exercise's cases that pass (status "pass"
when all do, "partial" when some do). A lab check that is not a ``labkit.check`` Spec is graded the
older way inside the sandbox (its check cell runs after the answers, in the same process) and
reported with ``"checked": "in-process"``: a submission can tamper with that one.
"""
from __future__ import annotations

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
    total: float | None = None            # seconds for a whole submission, every run (default 20 x timeout)
    judge: object = None                  # a judge.Judge (default: the process-wide one, judge.default())
    _deadline: float = field(default=float("inf"), repr=False)    # set by grade_one

    def budget(self) -> float:
        return self.total if self.total is not None else 20 * self.timeout


def _case_result(spec, case: dict, hidden: bool, event, judge=None) -> dict:
    """One case's verdict, judged in the judge's worker under its limits (``judge.Judge``). A hidden
    case's message says only pass or fail: what the check said (it can echo the answer, which can
    hold the case's parameters) is its ``detail``, shown to students only once grades are published
    (Gradescope's ``after_published``)."""
    from .judge import JudgeError, JudgeFailure, default
    name = "hidden case" if hidden else "case"
    if event is None:
        r = {"name": name, "passed": False, "message": "did not run"}
    else:
        try:
            v = (judge or default()).verdict(spec, event["data"], case)
            r = {"name": v["name"], "passed": v["passed"] is True,
                 "message": v["message"] + (f"\nhint: {v['hint']}" if v["hint"] and v["passed"] is not True else "")}
        except JudgeFailure as e:
            r = {"name": name, "passed": False, "message": f"the check could not judge what your code produced: {e}"}
        except Exception as e:  # noqa: BLE001 - malformed data from the sandbox, or a judge bug
            why = str(e)[:250] if isinstance(e, JudgeError) else f"{type(e).__name__}: {str(e)[:200]}"
            r = {"name": name, "passed": False, "message": f"the check could not read what your code produced ({why})"}
    if not hidden:
        return {**r, "hidden": False}
    return {"name": "hidden case", "hidden": True, "passed": r["passed"], "message": "passes" if r["passed"] else
            "fails (what the check said is shown once grades are published)",
            "detail": clean(f"{r['name']}: {r['message']}")}


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
    elif outcome.state == "memory":
        notes.append(f"memory limit: your code used {outcome.detail}")
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
    elif outcome.state in ("died", "protocol", "memory") or not cases:
        status = "error"
    else:
        status = "fail"
    first = next((c for c in cases if not c["passed"] and not c["hidden"]), None)
    hidden_bad = sum(c["hidden"] and not c["passed"] for c in cases)
    if status == "pass":
        msg = "; ".join(c["message"] for c in cases if not c["hidden"]) or "all cases pass"
    elif first is None and hidden_bad:         # never a hidden case's own words
        msg = (f"the visible cases pass; {hidden_bad} of {sum(c['hidden'] for c in cases)} hidden cases fail "
               "(what the check said is shown once grades are published)")
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
        outcome = run_job(opts.sandbox, folder, {**payload, "check_cell": ex.check_source}, opts.timeout,
                          total=_left(opts))
        return {**_legacy(ex, outcome, opts.timeout, earlier), "peak_mib": round(outcome.peak_bytes / 2**20)}, \
            _stuck_cell(outcome)
    cases = [(dict(c), False) for c in spec.cases]
    outcome = run_job(opts.sandbox, folder, {**payload, "cases": [c for c, _ in cases]}, opts.timeout,
                      total=_left(opts))
    stuck, hidden, peak = _stuck_cell(outcome), [], outcome.peak_bytes
    unwritten = _unwritten(outcome, len(cases))
    for k, case in enumerate(opts.hidden.get(ex.id, [])):   # each hidden case alone in its own run:
        run = None                                           # no other case's parameters to find there
        if unwritten is not None:                            # a stub fails every case alike: not run
            hidden.append(_case_result(spec, dict(case), True, unwritten, opts.judge))
            continue
        if not stuck and _left(opts) > 0:
            where = folder.with_name(f"{folder.name}-hidden-{k}")
            where.mkdir()
            shutil.copyfile(notebook, where / "submission.ipynb")
            run = run_job(opts.sandbox, where, {**payload, "cases": [dict(case)]}, opts.timeout, total=_left(opts))
        event = next((e for e in run.events if e["event"] == "data"), None) if run else None
        hidden.append(_case_result(spec, dict(case), True, event, opts.judge))
        peak = max(peak, run.peak_bytes if run else 0)
    result = judge_outcome(ex, spec, cases, outcome, opts.timeout, skipped, earlier, hidden, opts.judge)
    return {**result, "peak_mib": round(peak / 2**20)}, stuck


def _unwritten(outcome, n: int):
    """The first visible case's data event when every visible case reported the answer itself absent
    (``failed``: "stub", the exercise's ``raise`` still there, or "missing", its name not defined):
    what any case, hidden ones too, would report, whatever its parameters; else None."""
    data = [e for e in outcome.events if e.get("event") == "data"]
    if n == 0 or len(data) != n:
        return None
    kinds = [e["data"].get("failed") if isinstance(e.get("data"), dict) else None for e in data]
    return data[0] if all(k in ("stub", "missing") for k in kinds) else None


def _left(opts: Options) -> float:
    """Seconds left of the submission's budget (``opts._deadline`` is set by ``grade_one``)."""
    return opts._deadline - time.monotonic()


def judge_outcome(ex: Exercise, spec, cases: list, outcome, timeout: float, skipped=(), earlier=frozenset(),
                  more=(), judge=None) -> dict:
    """The exercise's result from what its run sent (``outcome.events``, parsed by ``events.parse``)
    and ``more`` cases judged from runs of their own (the hidden ones)."""
    data = {e["index"]: e for e in outcome.events if e["event"] == "data"}
    judged = [_case_result(spec, case, hidden, data.get(k), judge) for k, (case, hidden) in enumerate(cases)]
    return _score(ex, [*judged, *more], [*skipped, *_notes(outcome, timeout, earlier)], outcome, "isolated")


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


def read_submission(path) -> bytes:
    """The bytes of a regular file at ``path``, never through a symbolic link (a link to the master
    was graded as the master), a fifo or a device; at most :data:`MAX_NOTEBOOK` bytes."""
    import os
    import stat
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as e:
        raise ValueError("a symbolic link: refused" if os.path.islink(path) else e.strerror) from None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError("not a regular file: refused")
        data = f.read(MAX_NOTEBOOK + 1)
    if len(data) > MAX_NOTEBOOK:
        raise ValueError(f"larger than {MAX_NOTEBOOK // 2**20} MiB")
    return data


def grade_one(master, master_path: Path, path, opts: Options | None = None) -> dict:
    """Grade one submission; returns its result (the JSON object of one gradebook row)."""
    import nbformat
    opts = opts or Options()
    exs, t0 = exercises(master), time.monotonic()
    try:
        raw = read_submission(path)
        sub = nbformat.reads(raw.decode("utf-8"), as_version=4)
    except Exception as e:  # noqa: BLE001 - an unreadable file is reported, not raised
        return _summary(path, [_missing(ex, clean(f"could not read the notebook: {str(e)[:200]}")) for ex in exs])
    if not {c.get("id") for c in sub.cells} & {c.get("id") for c in master.cells}:
        return _summary(path, [_missing(ex, "no cell id of the master found: is this a copy of "
                                        f"{Path(master_path).name}, saved with its cell ids?") for ex in exs])
    todo = jobs(master, sub)
    if opts.workdir:
        Path(opts.workdir).mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="labkit-grade-", dir=opts.workdir)).resolve()
    try:
        notebook = tmp / "submission.ipynb"
        notebook.write_bytes(raw)                     # what was read and checked, not the path again
        results, skip, earlier = [], {}, set()
        opts._deadline = t0 + opts.budget()            # one budget for the whole submission
        for job in todo:                 # a cell that hung or crashed one exercise is left out of the next
            if _left(opts) <= 0:
                results.append({**_missing(job.exercise, f"not run: the submission's total time ({opts.budget():g} s) "
                                           "ran out"), "status": "timeout"})
                continue
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

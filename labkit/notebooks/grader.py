"""Grade student notebooks against their master (``python -m labkit.notebooks grade``).

1. **Restore.** The submission's cells are matched with the master's by cell id. Every locked
   cell (a master code cell that is neither a stub nor a solution: set-up, demos, checks) runs as
   the master has it: an edited check runs as the master's, a deleted one is put back after the
   nearest master cell the submission still has. The student's answer cells and any cells they
   added run as written.
2. **Run** every code cell in one kernel, ``timeout`` seconds each (``kernel.py``: timeouts and
   crashes are survived, so the next exercises are still graded).
3. **Read** each exercise's result from the output of its restored check cell only: "pass" when
   the cell printed at least as many ``[check]`` lines as the master's stored output, none of
   them FAIL, and raised nothing; "fail" with the check's own message and hint; "error" when the
   check raised or the kernel died in it; "timeout"; "missing" when the check never ran or
   reported too few results. A timeout or crash in the exercise's own cells (those since the
   previous check) is reported for that exercise, with the cell named.

What this does not stop: the student's code runs in the same Python process as the checks, so an
answer cell that deliberately patches ``labkit.check`` could fool it; such a cell is plain to see.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path

from .kernel import run_cells
from .schema import Exercise, check_lines, exercises, is_locked, meta, stdout

STATUSES = ("pass", "fail", "error", "timeout", "missing")


@dataclass
class Slot:
    cell: dict
    origin: str          # "locked" (the master's cell), "answer" (the student's cell with a
                         # master id), "student" (a cell the student added)
    where: str           # "your cell 5" or "the lab's cell 12", for messages


def merge(master, sub) -> list[Slot]:
    """The cells to run: the submission's, with the master's locked cells restored by id."""
    mindex = {c.get("id"): i for i, c in enumerate(master.cells)}
    locked = {c.get("id") for c in master.cells if is_locked(c)}
    slots, seen = [], set()
    for j, c in enumerate(sub.cells):
        cid = c.get("id")
        if cid in locked:
            if cid not in seen:      # a second cell claiming a locked id is dropped
                m = master.cells[mindex[cid]]
                slots.append(Slot(copy.deepcopy(m), "locked", f"the lab's cell {mindex[cid] + 1}"))
        else:
            origin = "answer" if cid in mindex and cid not in seen else "student"
            slots.append(Slot(copy.deepcopy(c), origin, f"your cell {j + 1}"))
        seen.add(cid)
    for i, m in enumerate(master.cells):   # put back the locked cells the submission lacks
        if m.get("id") in locked and m.get("id") not in seen:
            ids = [s.cell.get("id") for s in slots]
            before = [ids.index(p.get("id")) for p in master.cells[:i] if p.get("id") in ids]
            slots.insert(max(before) + 1 if before else 0,
                         Slot(copy.deepcopy(m), "locked", f"the lab's cell {i + 1}"))
            seen.add(m.get("id"))
    for s in slots:
        if s.cell.get("cell_type") == "code":
            s.cell["outputs"], s.cell["execution_count"] = [], None
    return slots


def _result(ex: Exercise, slots, outcomes, aborted, region, timeout: float) -> dict:
    at = next(i for i, s in enumerate(slots) if s.origin == "locked" and s.cell.get("id") == ex.check_id)
    out, lines = outcomes[at], check_lines(stdout(slots[at].cell))
    fails = [x for x in lines if not x.passed]
    if out is None:
        status, msg = "missing", f"the check did not run: {aborted or 'grading stopped before it'}"
    elif out.state == "timeout":
        status, msg = "timeout", f"the check did not finish within {timeout:g} s"
    elif out.state == "dead":
        status, msg = "error", ("the kernel died while the check ran your code "
                                "(os._exit, a crash, out of memory)")
    elif fails:
        status, msg = "fail", fails[0].text + (f"\nhint: {fails[0].hint}" if fails[0].hint else "")
    elif out.state == "error":
        status, msg = "error", f"the check raised {out.error}"
    elif len(lines) >= ex.expected:
        status, msg = "pass", "; ".join(x.text for x in lines)
    else:
        status, msg = "missing", f"the check reported {len(lines)} of {ex.expected} results"
    notes = []
    for k in region:
        o, where = outcomes[k], slots[k].where
        if o is not None and o.state == "timeout":
            notes.append(f"{where} did not finish within {timeout:g} s")
        elif o is not None and o.state == "dead":
            notes.append(f"the kernel died while running {where}")
        elif o is not None and o.state == "error" and slots[k].origin != "locked":
            notes.append(f"{where} raised {o.error}")
    if status != "pass" and notes:
        if status in ("fail", "error", "missing") and any("did not finish" in n for n in notes):
            status = "timeout"
        elif status in ("fail", "missing") and any("kernel died" in n for n in notes):
            status = "error"
        msg = "; ".join(notes) + "; then " + msg
    points = ex.max_points if status == "pass" else 0
    return {"id": ex.id, "status": status, "points": points, "max_points": ex.max_points, "message": msg}


def _summary(path, results) -> dict:
    return {"submission": str(path), "points": sum(r["points"] for r in results),
            "max_points": sum(r["max_points"] for r in results), "exercises": results}


def grade_one(master, master_path: Path, path, timeout: float = 300.0) -> dict:
    """Grade one submission; returns the JSON object of the issue's shape."""
    import nbformat
    exs = exercises(master)
    try:
        sub = nbformat.read(str(path), as_version=4)
    except Exception as e:  # noqa: BLE001 - an unreadable file is reported, not raised
        return _summary(path, [_missing(ex, f"could not read the notebook: {e}") for ex in exs])
    if not {c.get("id") for c in sub.cells} & {c.get("id") for c in master.cells}:
        return _summary(path, [_missing(ex, "no cell id of the master found: is this a copy of "
                                        f"{master_path.name}, saved with its cell ids?") for ex in exs])
    slots = merge(master, sub)
    run_nb = copy.deepcopy(master)
    run_nb.cells = [s.cell for s in slots]
    outcomes, aborted = run_cells(run_nb, run_nb.cells, str(master_path.parent), timeout,
                                  is_check=lambda c: meta(c).get("role") == "check")
    checks = {ex.check_id for ex in exs}
    results, start = [], 0
    for i, s in enumerate(slots):   # each exercise owns the cells since the previous check
        if s.origin == "locked" and s.cell.get("id") in checks:
            ex = next(e for e in exs if e.check_id == s.cell.get("id"))
            results.append(_result(ex, slots, outcomes, aborted, range(start, i), timeout))
            start = i + 1
    order = {ex.id: n for n, ex in enumerate(exs)}
    return _summary(path, sorted(results, key=lambda r: order[r["id"]]))


def _missing(ex: Exercise, message: str) -> dict:
    return {"id": ex.id, "status": "missing", "points": 0, "max_points": ex.max_points, "message": message}

"""The exercise metadata of a lab notebook, and the ``[check]`` lines its check cells print.

A graded exercise is three kinds of cell tied by one exercise id, in ``cell.metadata["labkit"]``:

    {"exercise": "ring-all-gather", "role": "stub"}                the cell the student edits
    {"exercise": "ring-all-gather", "role": "solution"}            the answer (master only)
    {"exercise": "ring-all-gather", "role": "check", "points": 2}  calls labkit.check (locked)
    {"role": "setup"}                                              imports the answers need (locked)
    {"role": "input"}                  a cell the student may edit and run, not an answer: a seed,
                                       a run whose output an answer reads (with "exercise": only
                                       for that exercise)

``points`` (an int >= 0, default 1) sits on the check cell; the grader gives partial credit: the
share of the exercise's cases (visible and hidden) that pass. ``setup`` cells are what the grader
runs before a submission's answer cells in each exercise's fresh process (the lab's imports, not
its demos). ``input`` cells are the student's like answers (kept, with their output, in the student
copy; run by the grader among the answer cells, in order), but belong to no stub: the seed an
instructor hands out, the tool run whose printout an exercise asks about. A markdown cell with ``{"role": "solution"}``
(no exercise needed) is an answer key for an open question. The tag ``solution`` (version 1 of
the labs) also marks a solution cell. Every other code cell of a master is *locked*: the grader
runs the master's version of it, whatever the submission holds.

The number of results a check cell must report (for a check that is not a ``labkit.check`` Spec,
graded by running the cell itself) is read from the master's stored output (made by ``refresh``):
as many ``[check]`` lines as the master printed, all PASS.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

ROLES = ("stub", "solution", "check", "setup", "input")
KEYS = {"exercise", "role", "points"}
ID_RE = re.compile(r"^[a-z0-9][a-z0-9_-]*$")


def meta(cell) -> dict:
    """The cell's ``labkit`` metadata ({} when absent or not a dict)."""
    m = cell.get("metadata", {}).get("labkit", {})
    return m if isinstance(m, dict) else {}


def role(cell) -> str | None:
    if "solution" in cell.get("metadata", {}).get("tags", []):
        return "solution"
    return meta(cell).get("role")


def is_solution(cell) -> bool:
    return role(cell) == "solution"


def is_setup(cell) -> bool:
    return cell.get("cell_type") == "code" and meta(cell).get("role") == "setup"


def is_locked(cell) -> bool:
    """A master code cell the student must not change: everything but stubs, solutions and inputs."""
    return cell.get("cell_type") == "code" and role(cell) not in ("stub", "solution", "input")


def stdout(cell) -> str:
    """All stdout text of a code cell's outputs, joined."""
    return "".join(o.get("text", "") for o in cell.get("outputs", [])
                   if o.get("output_type") == "stream" and o.get("name") == "stdout")


@dataclass(frozen=True)
class CheckLine:
    passed: bool
    text: str          # "name: message", the part after "[check] PASS " / "[check] FAIL "
    hint: str = ""


def check_lines(text: str) -> list[CheckLine]:
    """Parse ``[check] PASS|FAIL name: message`` lines and the ``hint:`` line under a FAIL."""
    found: list[CheckLine] = []
    for line in text.splitlines():
        if line.startswith(("[check] PASS ", "[check] FAIL ")):
            found.append(CheckLine(line[8:12] == "PASS", line[13:]))
        elif found and line.strip().startswith("hint:") and line[:1].isspace():
            last = found[-1]
            found[-1] = CheckLine(last.passed, last.text, line.strip()[len("hint:"):].strip())
    return found


@dataclass(frozen=True)
class Exercise:
    id: str
    max_points: int
    check_id: str            # cell id of the check cell in the master
    expected: int            # [check] lines the master's check cell printed
    cell_ids: frozenset      # ids of the master's stub, solution and check cells
    check_source: str = ""   # the master's check cell


def exercises(nb) -> list[Exercise]:
    """The graded exercises of a master, in the order of their check cells."""
    owned: dict[str, set] = {}
    for c in nb.cells:
        ex = meta(c).get("exercise")
        if ex:
            owned.setdefault(ex, set()).add(c.get("id"))
    out = []
    for c in nb.cells:
        m = meta(c)
        if m.get("role") == "check" and m.get("exercise"):
            out.append(Exercise(m["exercise"], int(m.get("points", 1)), c.get("id"),
                                len(check_lines(stdout(c))), frozenset(owned[m["exercise"]]), c.source))
    return out

"""``validate``: is a notebook a well-formed master or student copy? (as nbgrader's validate)

Every notebook: nbformat-valid with cell ids (nbformat 4.5), ids unique, ``labkit`` metadata in
the schema of ``schema.py``, each exercise with exactly one stub and one check cell (stub first).
A master (``solutions/``): a code solution cell between each stub and its check, no stub equal to
its solution, stored outputs for every code cell with no error, and each check cell's stored
output all PASS (so the grader knows how many results to expect). A student copy (``labs/``): no
solution cell or answer key, nothing stored under a stub, no stored PASS from a check (a stub must
not pass), and, given its master, exactly the master's student copy.
"""
from __future__ import annotations

import copy
import warnings

from .schema import ID_RE, KEYS, ROLES, check_lines, is_solution, meta, role, stdout
from .student import differences


def kind_of(nb) -> str:
    """'master' or 'student': the notebook's own ``labkit.kind``, else whether it has solutions."""
    kind = nb.metadata.get("labkit", {}).get("kind") if isinstance(nb.metadata.get("labkit"), dict) else None
    if kind in ("master", "student"):
        return kind
    return "master" if any(is_solution(c) for c in nb.cells) else "student"


def _schema_problems(nb) -> list[str]:
    problems, seen = [], {}
    for i, c in enumerate(nb.cells, 1):
        cid = c.get("id")
        if not cid:
            problems.append(f"cell {i} has no id (save it with nbformat >= 4.5)")
        elif cid in seen:
            problems.append(f"cells {seen[cid]} and {i} share the id {cid!r}")
        else:
            seen[cid] = i
        m, raw = meta(c), c.get("metadata", {}).get("labkit")
        if raw is not None and not isinstance(raw, dict):
            problems.append(f"cell {i}: metadata labkit must be an object")
        if not m:
            continue
        if set(m) - KEYS:
            problems.append(f"cell {i}: unknown labkit keys {sorted(set(m) - KEYS)}")
        if m.get("role") not in ROLES:
            problems.append(f"cell {i}: labkit role {m.get('role')!r} is not one of {ROLES}")
        ex = m.get("exercise")
        if ex is not None and not (isinstance(ex, str) and ID_RE.match(ex)):
            problems.append(f"cell {i}: exercise id {ex!r} must match {ID_RE.pattern}")
        needs_ex = m.get("role") in ("stub", "check") or (m.get("role") == "solution"
                                                          and c.cell_type == "code")
        if needs_ex and not ex:
            problems.append(f"cell {i}: a {m.get('role')} code cell must name its exercise")
        if m.get("role") in ("stub", "check", "setup", "input") and c.cell_type != "code":
            problems.append(f"cell {i}: a {m['role']} cell must be a code cell")
        if m.get("role") == "setup" and ex:
            problems.append(f"cell {i}: a setup cell belongs to no exercise")
        if "points" in m and (m.get("role") != "check" or isinstance(m["points"], bool)
                              or not isinstance(m["points"], int) or m["points"] < 0):
            problems.append(f"cell {i}: points must be an integer >= 0, on a check cell only")
    return problems


def _exercise_problems(nb, kind: str) -> list[str]:
    problems, cells = [], {}
    for i, c in enumerate(nb.cells, 1):
        if meta(c).get("exercise"):
            cells.setdefault(meta(c)["exercise"], []).append((i, role(c), c))
        elif c.cell_type == "code" and is_solution(c):
            problems.append(f"cell {i}: code solution tagged 'solution' names no exercise (metadata labkit)")
    for ex, found in cells.items():
        by_role = {r: [i for i, rr, _ in found if rr == r] for r in ROLES}
        for r in ("stub", "check"):
            if len(by_role[r]) != 1:
                problems.append(f"exercise {ex!r}: {len(by_role[r])} {r} cells (cells {by_role[r]}), "
                                "needs exactly 1")
        if len(by_role["stub"]) == 1 == len(by_role["check"]):
            stub, check = by_role["stub"][0], by_role["check"][0]
            if stub > check:
                problems.append(f"exercise {ex!r}: its stub (cell {stub}) comes after its check "
                                f"(cell {check})")
            sols = [i for i, r, c in found if r == "solution" and c.cell_type == "code"]
            if kind == "master" and not any(stub < i < check for i in sols):
                problems.append(f"exercise {ex!r}: no code solution cell between its stub and its check")
            stub_src = nb.cells[stub - 1].source.strip()
            if kind == "master" and any(nb.cells[i - 1].source.strip() == stub_src for i in sols):
                problems.append(f"exercise {ex!r}: the stub is the solution")
    return problems


def _output_problems(nb, kind: str) -> list[str]:
    problems = []
    for i, c in enumerate(nb.cells, 1):
        if c.cell_type != "code":
            continue
        lines, r = check_lines(stdout(c)), role(c)
        if kind == "master":
            skipped = "nbval-skip" in c.metadata.get("tags", [])
            if c.source.strip() and c.get("execution_count") is None and not skipped:
                problems.append(f"cell {i}: no stored output; run python -m labkit.notebooks refresh")
            if any(o.get("output_type") == "error" for o in c.get("outputs", [])):
                problems.append(f"cell {i}: its stored output is an error")
            if r == "check" and (not lines or not all(x.passed for x in lines)):
                problems.append(f"cell {i}: a master's check must print [check] PASS for every check "
                                f"(stored: {len(lines)} lines, {sum(not x.passed for x in lines)} FAIL)")
        else:
            if r == "stub" and c.get("outputs"):
                problems.append(f"cell {i}: a stub must be stored without output")
            if r == "check" and any(x.passed for x in lines):
                problems.append(f"cell {i}: the stored check output says PASS: the stub passes its own check")
    return problems


def validate(nb, kind: str | None = None, master=None) -> list[str]:
    """Problems of notebook ``nb`` as a ``kind`` ('master'/'student'; default: detected)."""
    import nbformat
    from nbformat.warnings import DuplicateCellId
    kind = kind or kind_of(nb)
    problems = _schema_problems(nb) + _exercise_problems(nb, kind) + _output_problems(nb, kind)
    try:   # on a copy: nbformat's validate renames duplicate ids in place (reported above)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DuplicateCellId)
            nbformat.validate(copy.deepcopy(nb))
    except nbformat.ValidationError as e:
        problems.insert(0, f"not a valid notebook: {str(e).splitlines()[0]}")
    if kind == "student":
        problems += [f"cell {i}: a student copy must not contain solutions or answer keys"
                     for i, c in enumerate(nb.cells, 1) if is_solution(c)]
        if master is not None:
            problems += differences(master, nb)
    return problems

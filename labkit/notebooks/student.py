"""Student copies: the master without its solutions, every cell id kept.

``solutions/X.ipynb`` (the master) holds each exercise as a stub cell, the solution cell after it
and the check cell; ``labs/X.ipynb`` is ``student_copy(master)``: the solution cells and answer
keys dropped, outputs cleared, ids and metadata unchanged, so the grader can match a student's
cells with the master's. ``differences`` tells whether a stored student copy has drifted.
"""
from __future__ import annotations

from pathlib import Path

from .schema import is_solution

IGNORED_CELL_METADATA = ("execution", "collapsed", "scrolled")   # set by running or viewing
# The first sentence of a lab's introduction says which copy the reader holds; the student copy's
# is written from the master's.
MASTER_BANNER = "> **This page is the lab's master, with its solutions: every check below passes.**"
STUDENT_BANNER = "> **This page is the lab's student copy: every check below fails until you write its exercise.**"


def make_student_copy(nb):
    """The student copy of master ``nb`` (a new node); returns (copy, solution cells dropped)."""
    import copy
    nb = copy.deepcopy(nb)
    kept = [c for c in nb.cells if not is_solution(c)]
    dropped = len(nb.cells) - len(kept)
    nb.cells = kept
    for c in nb.cells:
        if c.cell_type == "code":
            c.outputs, c.execution_count = [], None
        elif c.cell_type == "markdown" and MASTER_BANNER in c.source:
            c.source = c.source.replace(MASTER_BANNER, STUDENT_BANNER)
    nb.metadata.pop("widgets", None)
    nb.metadata["labkit"] = {"kind": "student"}
    return nb, dropped


def student_copy(src, dst) -> int:
    """Write ``dst`` = the student copy of master ``src``. Returns the number of cells dropped."""
    import nbformat
    nb, dropped = make_student_copy(nbformat.read(src, as_version=4))
    Path(dst).parent.mkdir(parents=True, exist_ok=True)  # e.g. a class folder that does not exist yet
    nbformat.write(nb, dst)
    return dropped


def _comparable(cell) -> tuple:
    meta = {k: v for k, v in cell.get("metadata", {}).items() if k not in IGNORED_CELL_METADATA}
    return cell.get("id"), cell.get("cell_type"), cell.get("source"), meta


def differences(master_nb, student_nb) -> list[str]:
    """How ``student_nb`` differs from the student copy of ``master_nb`` (outputs ignored)."""
    want = [_comparable(c) for c in make_student_copy(master_nb)[0].cells]
    have = [_comparable(c) for c in student_nb.cells]
    problems = []
    if [w[0] for w in want] != [h[0] for h in have]:
        problems.append(f"cell ids differ: the master's student copy has {[w[0] for w in want]}, "
                        f"this notebook {[h[0] for h in have]}")
        return problems
    for i, (w, h) in enumerate(zip(want, have)):
        for what, a, b in (("type", w[1], h[1]), ("source", w[2], h[2]), ("metadata", w[3], h[3])):
            if a != b:
                problems.append(f"cell {i + 1} (id {w[0]}): {what} differs from the master's")
    return problems

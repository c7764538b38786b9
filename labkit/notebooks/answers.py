"""What of a submission the grader runs: each exercise's answer cells, and nothing else.

The submission's cells are matched with the master's by cell id (:func:`merge`). The grader then
builds one job per exercise (:func:`jobs`): the master's ``setup`` cells (the lab's imports), and
the student's answer cells up to that exercise's check, in order: the stubs they filled in, the
``input`` cells and the cells they added, those of earlier exercises included (an input cell that
names an exercise only in that exercise's job) (a later exercise may use an earlier
answer, as the capstone does). Locked cells (demos, the checks themselves) never run when
grading: a check cell edited, deleted or rebound in the submission changes nothing.

:func:`flags` lists constructs in the answers that reach into the grading process (import
machinery, ``gc``, ``ctypes``, code objects, processes, signals, files outside the folder): not a
verdict, a pointer for the instructor (``book/instructors.md``, "Threat model").
"""
from __future__ import annotations

import ast
import copy
from dataclasses import dataclass

from .schema import exercises, is_locked, is_setup, meta, role


@dataclass
class Slot:
    cell: dict
    origin: str          # "locked" (the master's cell), "answer" (the student's cell with a
                         # master id), "student" (a cell the student added)
    where: str           # "your cell 5" or "the lab's cell 12", for messages


def merge(master, sub) -> list[Slot]:
    """The cells of the submission, with the master's locked cells restored by id."""
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


@dataclass
class Job:
    exercise: object            # schema.Exercise
    setup: list                 # the master's setup cells' source
    answers: list               # [(where, source)], in notebook order


def _imports_only(src: str) -> bool:
    try:
        body = ast.parse(src).body
    except SyntaxError:
        return False
    return bool(body) and all(isinstance(node, (ast.Import, ast.ImportFrom)) for node in body)


def setup_sources(master) -> list[str]:
    """The master's ``setup`` cells; a lab written before that role had none: then its locked code
    cells made only of imports (what a setup cell holds), so that its checks find their names."""
    marked = [c.source for c in master.cells if is_setup(c)]
    return marked or [c.source for c in master.cells if is_locked(c) and _imports_only(c.source)]


def jobs(master, sub) -> list[Job]:
    """One job per exercise of the master, in the order of its check cells."""
    slots = merge(master, sub)
    setup = setup_sources(master)
    # an input cell of one exercise (by the master's metadata, not the submission's) runs for it only
    scoped = {c.get("id"): meta(c)["exercise"] for c in master.cells if role(c) == "input" and meta(c).get("exercise")}
    out = []
    for ex in exercises(master):
        at = next(i for i, s in enumerate(slots) if s.origin == "locked" and s.cell.get("id") == ex.check_id)
        answers = [(s.where, s.cell.get("source", "")) for s in slots[:at]
                   if s.origin in ("answer", "student") and s.cell.get("cell_type") == "code"
                   and s.cell.get("source", "").strip()
                   and scoped.get(s.cell.get("id"), ex.id) == ex.id]
        out.append(Job(ex, setup, answers))
    return out


# Copies of labkit the grader flags (book/instructors.md, "What the flags see"): running or loading
# its source under another name (runpy, importlib and its loaders, get_code/get_source/get_data,
# compile/exec), reading its files (open, pathlib's read_text/read_bytes, __file__, a path naming labkit)
SUSPECT_MODULES = {"importlib", "ctypes", "gc", "inspect", "builtins", "subprocess", "signal", "socket",
                   "multiprocessing", "pickle", "marshal", "types", "sys", "runpy", "pkgutil", "zipimport", "imp",
                   "linecache", "dis", "code", "codeop"}
SUSPECT_ATTRS = {"__code__", "__globals__", "__closure__", "__builtins__", "__dict__", "__subclasses__",
                 "modules", "meta_path", "reload", "spec_from_file_location", "FunctionType", "kill",
                 "killpg", "fork", "setsid", "system", "popen", "exec_module", "_getframe", "f_back",
                 "run_path", "run_module", "get_code", "get_source", "get_data", "source_to_code", "loader",
                 "__spec__", "__loader__", "__file__", "__path__", "read_text", "read_bytes", "getsource",
                 "find_spec", "load_module", "SourceFileLoader", "module_from_spec", "getlines"}
SUSPECT_CALLS = {"exec", "eval", "compile", "open", "__import__", "setattr", "globals", "vars"}


def flags(answers) -> list[dict]:
    """[{"where", "what"}]: the constructs of ``answers`` [(where, source)] worth a look."""
    found = []
    for where, src in answers:
        try:
            tree = ast.parse(src)
        except SyntaxError:
            continue
        seen = set()
        for node in ast.walk(tree):
            what = None
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names] + ([node.module] if getattr(node, "module", None) else [])
                hit = sorted({n.split(".")[0] for n in names} & SUSPECT_MODULES)
                what = f"imports {', '.join(hit)}" if hit else None
            elif isinstance(node, ast.Attribute) and node.attr in SUSPECT_ATTRS:
                what = f"uses .{node.attr}"
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in SUSPECT_CALLS:
                what = f"calls {node.func.id}()"
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and "labkit" in node.value and (
                    "/" in node.value or node.value.endswith((".py", ".pyc"))):
                what = "names a file of labkit"
            if what and what not in seen:
                seen.add(what)
                found.append({"where": where, "what": what})
    return found

"""Before any student: the master itself, graded by this grader, must get full marks.

What it proves is the set-up, not the master: the interpreter the sandbox starts (a venv's own
``python``, with torch), the sandbox, the folder it works in, the time limit, the hidden cases. A
grader started from a base interpreter that does not see the venv's packages once gave the
pipeline lab's master 0/6 and every student 0 with it, silently. So ``grade`` and
``run-autograder`` grade the master first and refuse to go on, saying which exercise failed and
why, unless it gets every point.

The verdict is cached under a key made of everything it depends on (labkit's files, the master,
the hidden cases, the interpreter, the sandbox and its limits, the timeout): a second run with the
same set-up costs nothing; a changed file or another environment grades the master again.
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

from .integrity import Fingerprint


class SetupError(ValueError):
    """The master does not get full marks with this grader's set-up: no student is graded."""


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "labkit" / "master-checks"


def key(master_path: Path, opts, fingerprint: Fingerprint) -> str:
    """A digest of everything the master's grade depends on."""
    box = opts.sandbox
    parts = {"files": fingerprint.files, "python": os.path.abspath(sys.executable), "version": sys.version,
             "sandbox": [box.kind, box.image, repr(box.limits)], "timeout": opts.timeout,
             "hidden": opts.hidden, "master": str(Path(master_path).resolve())}
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:32]


def check_master(master, master_path: Path, opts, fingerprint: Fingerprint, cache: Path | None = None) -> dict:
    """Grade the master (or read the cached verdict); raise :class:`SetupError` unless full marks."""
    from .grader import grade_one
    cache = cache_dir() if cache is None else Path(cache)
    where = cache / f"{key(master_path, opts, fingerprint)}.json"
    try:
        result = json.loads(where.read_text())
    except (OSError, ValueError):
        result = None
    if not (isinstance(result, dict) and result.get("points") == result.get("max_points")):
        result = grade_one(master, Path(master_path), Path(master_path), opts)
    if result["points"] != result["max_points"]:
        bad = [x for x in result["exercises"] if x["points"] != x["max_points"]]
        lines = "\n  ".join(f"{x['id']}: {x['status']}: {x['message'][:300]}" for x in bad[:5])
        raise SetupError(
            f"the master {master_path} gets {result['points']:g}/{result['max_points']} points with this "
            f"grader's set-up (interpreter {os.path.abspath(sys.executable)}, sandbox {opts.sandbox.kind}, "
            f"timeout {opts.timeout:g} s), so no student is graded:\n  {lines}\nRun the grader from the "
            "environment where labkit and torch are installed (the venv's own python), or raise --timeout")
    try:
        cache.mkdir(parents=True, exist_ok=True)
        tmp = where.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"points": result["points"], "max_points": result["max_points"]}))
        os.replace(tmp, where)
    except OSError:
        pass                                   # no cache: the master is graded again next time
    return result

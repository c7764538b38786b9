"""Grade a class: every submission against one master, into a gradebook an LMS takes.

Written by the grader's process only, after *each* submission, atomically (a temporary file in the
same folder, fsync, rename), never through a symbolic link: a run killed half-way keeps every
submission graded so far, and ``--resume`` goes on from there. In ``out_dir``:

    <assignment>.json         {"assignment", "master", "exercises": [{"id", "max_points", "cases"}],
                               "submissions": [ONE, ...]}
    <assignment>.csv          student_id,submission,submitted_at,graded_at,<exercise>...,points,max_points
    <assignment>-canvas.csv   Student,ID,SIS User ID,SIS Login ID,Section,<assignment> (<canvas id>)

ONE is what ``--json`` prints per submission: {"student_id", "submission", "sha256",
"submitted_at", "graded_at", "points", "max_points", "exercises": [{"id", "status", "points",
"max_points", "message", "checked", "cases": [{"name", "hidden", "passed", "message"}]}],
"flags", "sandbox", "seconds"}. Students come from a file-name pattern (``--id-pattern``, a
regular expression with a group ``id``) or a roster CSV (``--roster``: ``id`` and optionally
``name``, ``file``, ``canvas_id``, ``sis_user_id``, ``sis_login_id``, ``section``); roster students
without a submission get a row with 0 points.
"""
from __future__ import annotations

import csv
import datetime
import hashlib
import io
import json
import os
import re
from pathlib import Path

from .grader import Options, grade_one
from .integrity import Fingerprint
from .preflight import check_master
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


def hidden_file(master_path: Path, hidden_path=None) -> Path:
    """``hidden/<master stem>.json`` beside the master, unless ``hidden_path`` names another file."""
    return Path(hidden_path) if hidden_path else Path(master_path).parent / "hidden" / f"{Path(master_path).stem}.json"


def load_hidden(master_path: Path, hidden_path=None) -> dict:
    """{exercise id: [case, ...]} of the hidden tests (none when the file is absent)."""
    path = hidden_file(master_path, hidden_path)
    if not path.exists():
        if hidden_path:
            raise MasterError(f"no hidden-test file {path}")
        return {}
    data = json.loads(path.read_text())
    if not isinstance(data, dict) or not all(isinstance(v, list) and all(isinstance(c, dict) for c in v)
                                             for v in data.values()):
        raise MasterError(f"{path}: expected {{exercise id: [case, ...]}}")
    return data


# -- who is who ----------------------------------------------------------------------------------
def load_roster(path) -> list[dict]:
    with open(path, newline="", encoding="utf-8-sig") as f:
        rows = [{k.strip().lower(): (v or "").strip() for k, v in row.items() if k} for row in csv.DictReader(f)]
    if not rows or "id" not in rows[0]:
        raise ValueError(f"roster {path}: needs a header with an 'id' column (and optionally name, file, "
                         "canvas_id, sis_user_id, sis_login_id, section)")
    return rows


def student_id(path, pattern: str | None, roster: list[dict] | None) -> str:
    """The student of a submission: the roster row whose ``file`` is its name, else the pattern's
    group ``id`` (default: the file's stem), which must then be in the roster if there is one. The
    pattern must match the whole file name (with or without ``.ipynb``), never a folder or a part
    of it (``mallory_bob_tensor.ipynb`` is not bob's); a name two roster rows claim is refused."""
    name = Path(path).name
    rows = [row for row in roster or [] if row.get("file") and row["file"] == name]
    if len({row["id"] for row in rows}) > 1:
        raise ValueError(f"{path}: the roster gives this file to {len(rows)} students "
                         f"({', '.join(sorted(r['id'] for r in rows))}): refused")
    if pattern:
        m = re.fullmatch(pattern, name) or re.fullmatch(pattern, Path(name).stem)
        if not m or "id" not in m.groupdict() or not m.group("id"):
            raise ValueError(f"{path}: --id-pattern {pattern!r} does not match the whole file name {name!r} "
                             "with a group 'id'")
        sid = m.group("id")
    else:
        sid = Path(path).stem
    if rows:
        if pattern and sid != rows[0]["id"]:
            raise ValueError(f"{path}: the roster gives this file to {rows[0]['id']!r}, its name to {sid!r}: refused")
        return rows[0]["id"]
    if roster and sid not in {r["id"] for r in roster}:
        raise ValueError(f"{path}: student id {sid!r} is not in the roster")
    return sid


# -- writing safely ------------------------------------------------------------------------------
def open_out_dir(out_dir: Path) -> int:
    """A descriptor of ``out_dir`` (made if absent), refusing a symbolic link."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    try:
        return os.open(out_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError as e:
        raise MasterError(f"output folder {out_dir} cannot be used ({e.strerror}): it must be a real "
                          "folder, not a symbolic link") from None


def check_target(dir_fd: int, name: str) -> None:
    """A gradebook file must be absent or a regular file (a folder or a link there is refused)."""
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return
    import stat
    if not stat.S_ISREG(st.st_mode):
        kind = "symbolic link" if stat.S_ISLNK(st.st_mode) else "folder" if stat.S_ISDIR(st.st_mode) else "special file"
        raise MasterError(f"{name} in the output folder is a {kind}, not a file: move it away (the grader "
                          "never writes through links)")


def atomic_write(dir_fd: int, name: str, text: str) -> None:
    check_target(dir_fd, name)
    tmp = f".{name}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644, dir_fd=dir_fd)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)   # replaces a file, never follows
    except BaseException:
        try:
            os.unlink(tmp, dir_fd=dir_fd)
        except OSError:
            pass
        raise
    os.fsync(dir_fd)


# -- the three files ----------------------------------------------------------------------------
def cell(value):
    """A CSV cell a spreadsheet shows as text: one starting with =, +, -, @ (or a tab, a carriage
    return) would be read as a formula (OWASP, "CSV Injection"), so it gets a leading '; numbers
    stay numbers; control characters go."""
    if type(value) in (int, float):
        return value
    from .events import clean
    text = clean(str(value), 1000)
    return "'" + text if text[:1] in ("=", "+", "-", "@", "\t", "\r") else text


def _csv(rows) -> str:
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerows([[cell(v) for v in row] for row in rows])
    return buf.getvalue()


def render(book: dict, roster=None, canvas_id: str | None = None) -> dict[str, str]:
    """{file name: text} of the gradebook ``book``."""
    name, exs = book["assignment"], book["exercises"]
    ids = [e["id"] for e in exs]
    subs = book["submissions"]
    table = [["student_id", "submission", "submitted_at", "graded_at", *ids, "points", "max_points"]]
    for r in subs:
        pts = {x["id"]: x["points"] for x in r["exercises"]}
        table.append([r["student_id"], r["submission"], r["submitted_at"], r["graded_at"],
                      *[pts.get(i, 0) for i in ids], r["points"], r["max_points"]])
    best = {}
    for r in subs:                                   # a student's best submission counts
        if r["student_id"] not in best or r["points"] > best[r["student_id"]]["points"]:
            best[r["student_id"]] = r
    column = f"{name} ({canvas_id})" if canvas_id else name
    canvas = [["Student", "ID", "SIS User ID", "SIS Login ID", "Section", column]]
    people = roster or [{"id": sid} for sid in best]
    for p in people:
        got = best.get(p["id"])
        canvas.append([p.get("name", ""), p.get("canvas_id", p["id"]), p.get("sis_user_id", ""),
                       p.get("sis_login_id", ""), p.get("section", ""), got["points"] if got else 0])
    return {f"{name}.json": json.dumps(book, indent=1) + "\n", f"{name}.csv": _csv(table),
            f"{name}-canvas.csv": _csv(canvas)}


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def _sha256(path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def grade(submissions, master_path, out_dir="grades", opts: Options | None = None, on_result=None, *,
          assignment=None, id_pattern=None, roster=None, canvas_id=None, hidden_path=None,
          resume: bool = False) -> list[dict]:
    """Grade each submission; after each, rewrite the gradebook in ``out_dir``; return the results."""
    master_path = Path(master_path)
    master = load_master(master_path)
    opts = opts or Options()
    if not opts.hidden:
        opts.hidden = load_hidden(master_path, hidden_path)
    name = assignment or master_path.stem
    people = load_roster(roster) if roster else None
    who = {str(p): student_id(p, id_pattern, people) for p in submissions}     # fail before grading
    dir_fd = open_out_dir(Path(out_dir)) if out_dir is not None else None
    files = [f"{name}.json", f"{name}.csv", f"{name}-canvas.csv"]
    for f in files if dir_fd is not None else ():
        check_target(dir_fd, f)
    book = {"assignment": name, "master": str(master_path), "exercises": [
        {"id": e.id, "max_points": e.max_points} for e in exercises(master)], "submissions": []}
    if resume and dir_fd is not None:
        try:
            with open(os.open(f"{name}.json", os.O_RDONLY | os.O_NOFOLLOW, dir_fd=dir_fd)) as f:
                book["submissions"] = json.load(f).get("submissions", [])
        except FileNotFoundError:
            pass
    done = {(r["submission"], r.get("sha256")) for r in book["submissions"]}
    trusted = [master_path] + [p for p in [hidden_file(master_path, hidden_path)] if p.exists()]
    fingerprint = Fingerprint.of(opts.sandbox.labkit_root, *trusted)
    if opts.check_master:                          # the set-up proven on the master before any student
        check_master(master, master_path, opts, fingerprint)
    results = []
    try:
        for path in submissions:
            digest = _sha256(path) if Path(path).is_file() else ""
            if (str(path), digest) in done:
                continue
            try:
                r = grade_one(master, master_path, path, opts)
            except Exception as e:  # noqa: BLE001 - this submission's error row; the run goes on
                r = broken_row(master, path, e)
            mtime = Path(path).stat().st_mtime if Path(path).exists() else None
            r = {"student_id": who[str(path)], "sha256": digest, "submitted_at": datetime.datetime.fromtimestamp(
                mtime, datetime.timezone.utc).isoformat(timespec="seconds") if mtime else "",
                 "graded_at": _now(), **r}
            fingerprint.verify(after=str(path))
            results.append(r)
            book["submissions"].append(r)
            if dir_fd is not None:
                for fname, text in render(book, people, canvas_id).items():
                    atomic_write(dir_fd, fname, text)
            if on_result:
                on_result(r)
        if dir_fd is not None and not book["submissions"]:
            for fname, text in render(book, people, canvas_id).items():
                atomic_write(dir_fd, fname, text)
    finally:
        if dir_fd is not None:
            os.close(dir_fd)
    return results


def broken_row(master, path, e: BaseException) -> dict:
    """The row of a submission the grader failed on: 0 points, the reason; written like any other, so
    ``--resume`` goes past it."""
    from .events import clean
    why = clean(f"the grader failed on this submission ({type(e).__name__}: {e})", 600)
    exs = [{"id": x.id, "status": "error", "points": 0, "max_points": x.max_points, "message": why,
            "checked": "none", "cases": []} for x in exercises(master)]
    return {"submission": str(path), "points": 0, "max_points": sum(x["max_points"] for x in exs),
            "exercises": exs, "flags": [], "sandbox": "", "seconds": 0}


def human(result: dict) -> str:
    """A submission's result as text: a total line, then one line per exercise."""
    who = f"{result['student_id']} ({result['submission']})" if result.get("student_id") else result["submission"]
    lines = [f"{who}: {result['points']:g}/{result['max_points']} points"]
    width = max((len(x["id"]) for x in result["exercises"]), default=0)
    for x in result["exercises"]:
        head = f"  {x['status'].upper():8} {x['id']:{width}} {x['points']:g}/{x['max_points']}  "
        lines.append(head + x["message"].replace("\n", "\n" + " " * len(head)))
    if result.get("flags"):
        lines.append("  flags: " + "; ".join(f"{f['where']} {f['what']}" for f in result["flags"][:8]))
    return "\n".join(lines)

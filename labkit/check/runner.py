"""``python -m labkit.check.runner``: run one exercise's student code, in the grader's sandbox.

The grader (``labkit.notebooks.grader``) starts one runner per exercise and submission, in a fresh
process inside the sandbox (``labkit.notebooks.sandbox``), and writes one job to its stdin:

    {"exercise": "conjugates", "setup": [source, ...], "answers": [[where, source], ...],
     "cases": [{...}, ...], "check_cell": null}

The runner bans labkit's implementation of the exercise, runs the lab's set-up cells and the
answer cells (each reported before it starts, so the grader can time it), then each case's
``produce`` (ranks load the same source themselves), and answers on its original stdout, one JSON
object per line (the student's own prints go to ``output.txt`` in the working folder):

    {"event": "cell", "index": i, "where": "your cell 5"}       before answer cell i
    {"event": "cells", "errors": [[where, "NameError: ..."]]}  after the last one
    {"event": "case", "index": k} / {"event": "data", "index": k, "data": ...}
    {"event": "legacy", "stdout": "...", "error": ""}          (a check cell run in-process)
    {"event": "done"}

Data is :mod:`labkit.check.wire` JSON: the grader never unpickles anything from here. The
verdict is not made here: ``judge`` runs in the grader's process. ``--drop-to UID:GID`` switches
to that user first (the sandbox starts as root when the grader is root).
"""
from __future__ import annotations

import json
import os
import sys

MAX_JOB = 8 * 2**20


def _drop(ids: str) -> None:
    uid, gid = (int(v) for v in ids.split(":"))
    os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)
    if os.getuid() != uid or os.geteuid() != uid:
        raise SystemExit("could not drop privileges")


class Channel:
    """The grader's line protocol, on a private copy of the original stdout."""

    def __init__(self):
        self.fd = os.dup(1)
        out = os.open("output.txt", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(out, 1)
        os.dup2(out, 2)
        os.close(out)
        sys.stdout = open(1, "w", buffering=1, closefd=False)
        sys.stderr = open(2, "w", buffering=1, closefd=False)

    def send(self, **event) -> None:
        self.write((json.dumps(event, separators=(",", ":")) + "\n").encode())

    def write(self, data: bytes) -> None:
        """All of ``data``: a write to a full pipe can be cut short by a signal (a rank exiting)."""
        view = memoryview(data)
        while view:
            view = view[os.write(self.fd, view):]


def _legacy(job, chan) -> None:
    """A check cell that is not a Spec: run it here after the answers and send what it printed
    (the grader parses its [check] lines). It runs in the student's process: reported as such."""
    import contextlib
    import io

    from labkit.check.spec import Source, short_error
    src = Source(job.get("setup", []), [tuple(a) for a in job.get("answers", [])], {})
    ns = src.run_cells(lambda i, where: chan.send(event="cell", index=i, where=where))
    chan.send(event="cells", errors=src.errors)
    out, error = io.StringIO(), ""
    try:
        with contextlib.redirect_stdout(out):
            exec(compile(job["check_cell"], "<the lab's check cell>", "exec"), ns)   # noqa: S102 - the master's
    except BaseException as e:  # noqa: BLE001 - the check's own error
        error = short_error(e)
    chan.send(event="legacy", stdout=out.getvalue()[-20000:], error=error)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--drop-to" in argv:
        _drop(argv[argv.index("--drop-to") + 1])
    raw = sys.stdin.buffer.read(MAX_JOB + 1)
    chan = Channel()
    if len(raw) > MAX_JOB:
        chan.send(event="error", message="job too large")
        return 2
    job = json.loads(raw)
    os.environ.setdefault("LABKIT_BACKEND", "gloo")
    if job.get("check_cell"):
        _legacy(job, chan)
        chan.send(event="done")
        return 0
    from labkit.check import wire
    from labkit.check.registry import find
    from labkit.check.spec import Source
    spec = find(job["exercise"])
    if spec is None:
        chan.send(event="error", message=f"no check for exercise {job['exercise']!r}")
        return 2
    student = Source(job.get("setup", []), [tuple(a) for a in job.get("answers", [])], dict(spec.names),
                     tuple(spec.forbid), spec.why)
    student.run_cells(lambda i, where: chan.send(event="cell", index=i, where=where))
    chan.send(event="cells", errors=student.errors)
    for k, case in enumerate(job.get("cases", [])):
        chan.send(event="case", index=k)
        try:
            data = spec.produce(student, **case)
            text = wire.dumps(data)
        except Exception as e:  # noqa: BLE001 - the student's objects may not be data
            from labkit.check.spec import failure, short_error
            text = wire.dumps(failure("raised", short_error(e)))
        chan.write((f'{{"event":"data","index":{k},"data":' + text + "}\n").encode())
    chan.send(event="done")
    return 0


if __name__ == "__main__":
    sys.exit(main())

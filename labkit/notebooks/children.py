"""The grader's children: started, registered and reaped so that one job's clean-up never takes
another's.

The grader is made subreaper (:func:`become_subreaper`): daemons a submission leaves behind are
re-parented to it, and :func:`reap` kills and waits for every child that appeared during a job and
is not registered in :data:`LIVE`. Several threads may grade: a child is started and registered
under :data:`SPAWN`, and ``reap`` picks its strays under it too. Without that, a runner between
fork and registration was taken for a stray, killed and reaped by another job's ``reap``, and its
``Popen`` read "exit code 0" (the status was taken) with no events.
"""
from __future__ import annotations

import os
import signal
import subprocess
import threading
from pathlib import Path

LIVE: set[int] = set()                     # children in use: runners of jobs in progress, docker rm
SPAWN = threading.Lock()


def spawn(argv: list[str], **kw) -> subprocess.Popen:
    """Start a child and register it in ``LIVE`` (the caller discards it once it is reaped)."""
    with SPAWN:
        proc = subprocess.Popen(argv, **kw)
        LIVE.add(proc.pid)
    return proc


def run(argv: list[str], timeout: float) -> int:
    """``subprocess.run`` for the grader's own helpers (``docker rm``), safe from other jobs' reap."""
    proc = spawn(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()
    finally:
        LIVE.discard(proc.pid)


def children() -> set[int]:
    """This process's children now (by reading /proc: no process is started to find them)."""
    me, found = os.getpid(), set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == me:
                found.add(int(entry))
    return found


def reap(before: set[int]) -> None:
    """Kill and reap children that appeared since ``before``: daemons a submission left behind,
    re-parented to this process (it is a subreaper: :func:`become_subreaper`)."""
    for _ in range(3):
        with SPAWN:                                 # no child is between fork and LIVE now
            strays = children() - before - LIVE     # never another job's runner
            for pid in strays:
                for kill in (lambda: os.killpg(pid, signal.SIGKILL), lambda: os.kill(pid, signal.SIGKILL)):
                    try:
                        kill()
                    except (ProcessLookupError, PermissionError):
                        pass
        if not strays:
            return
        for pid in strays:
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass


def become_subreaper() -> bool:
    """Make orphans of our descendants our children (Linux prctl PR_SET_CHILD_SUBREAPER)."""
    try:
        import ctypes
        return ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False

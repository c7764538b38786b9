"""Start and stop the runner process of one grading job in its sandbox (for ``sandbox.run_job``):
the seccomp filter on a pipe, the per-run memory cgroup and tmpfs caps entered in the child, the
environment a sandbox kind gets, and a kill of the whole session."""
from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

from . import seccomp
from .caps import MOUNTS, MemoryCap, inode_cap_why, private_tmpfs
from .children import run, spawn


def start_runner(sandbox, folder: Path, name: str, cap: MemoryCap) -> subprocess.Popen:
    """Start the runner in its sandbox (bwrap: with the seccomp filter on a pipe it reads first; as
    root, in tmpfs mounts of capped files; in ``cap``'s cgroup where one was made)."""
    prog = seccomp.program() if sandbox.kind == "bwrap" else None
    private = sandbox.kind == "bwrap" and sandbox.limits.files > 0 and not inode_cap_why()
    points = [folder / ".mnt" / m for m in MOUNTS] if private else []
    for p in points:
        p.mkdir(parents=True, exist_ok=True)
    lim = sandbox.limits

    def child() -> None:                       # after fork, before exec: the grader's threads are gone here
        cap.enter()
        if points:
            private_tmpfs(points, lim.disk_bytes, lim.files)
        lim.apply()
    rfd = None
    if prog:
        rfd, wfd = os.pipe()                  # bwrap reads the filter to its end, before it runs anything
        os.write(wfd, prog)
        os.close(wfd)
    try:
        return spawn(sandbox.argv(folder, name, rfd, private), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                     stderr=subprocess.DEVNULL, cwd=str(folder), start_new_session=True,
                     pass_fds=(rfd,) if prog else (), preexec_fn=child, env=runner_env(sandbox))
    finally:
        if rfd is not None:
            os.close(rfd)


def runner_env(sandbox) -> dict:
    if sandbox.kind != "none":
        return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"}
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LABKIT_LIVE", "PYTHON"))}
    env.update(LABKIT_BACKEND="gloo", MPLBACKEND="Agg", PYTHONDONTWRITEBYTECODE="1",
               PYTHONPATH=str(sandbox.labkit_root))
    return env


def kill_runner(sandbox, proc, name: str) -> None:
    if sandbox.kind == "docker":
        run(["docker", "rm", "-f", name], timeout=60)
    try:
        os.killpg(proc.pid, signal.SIGKILL)   # its session: bwrap and the namespace's init with it
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=30)
    for stream in (proc.stdin, proc.stdout):
        if stream and not stream.closed:
            stream.close()

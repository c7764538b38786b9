"""Caps for a whole run of a submission, beyond the per-process rlimits of ``sandbox.Limits``.

* **Memory, all processes together** (:class:`MemoryCap`): a cgroup of its own per run, under the
  grader's own cgroup, with the v1 memory controller's ``memory.limit_in_bytes`` (this course's
  machines have cgroup v1 only; v2 is not implemented here). Everything the runner starts (gloo
  ranks, forks) and the pages of its tmpfs files (``/tmp``, ``/dev/shm``, ``/grade``) are charged to
  it; going over it makes the kernel kill a process of the run (``memory.oom_control``'s
  ``oom_kill`` counts it), and the grader reports "memory limit". Where the hierarchy is not
  writable (not root, a read-only ``/sys/fs/cgroup``) there is no such cap: :func:`cgroup_why`
  says why, and the per-process ``RLIMIT_AS`` alone holds.
* **Files, per tmpfs** (:func:`private_tmpfs`): bubblewrap 0.8's ``--size`` bounds a tmpfs's bytes,
  not its inodes. When the grader is root, the sandbox's child makes a private mount namespace
  and mounts ``/grade``, ``/tmp`` and ``/dev/shm`` itself with ``nr_inodes`` (``tmpfs(5)``) before it
  starts bwrap, which binds them: creating one file too many fails with ``ENOSPC``. The mounts live
  in that namespace only and vanish with it. Not root: bwrap's byte-sized tmpfs, no inode cap.
"""
from __future__ import annotations

import ctypes
import os
import uuid
from pathlib import Path

V1 = Path("/sys/fs/cgroup/memory")
MOUNTS = ("grade", "tmp", "shm")           # the writable places of a bwrap sandbox, as mount points


def _own_v1() -> Path | None:
    """This process's cgroup in the v1 memory hierarchy, or None."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, ctrls, path = line.split(":", 2)
        if "memory" in ctrls.split(","):
            return V1 / path.lstrip("/")
    return None


def cgroup_why() -> str:
    """"" when a per-run memory cgroup can be made here, else why not."""
    own = _own_v1()
    if own is None or not (own / "memory.limit_in_bytes").exists():
        return "no cgroup v1 memory controller (cgroup v2 is not implemented)"
    return "" if os.access(own, os.W_OK) else f"{own} is not writable (run the grader as root)"


class MemoryCap:
    """One cgroup with a memory limit for one run of a submission: :meth:`make`, then :meth:`enter`
    in the child before exec, :meth:`oom_kills` and :meth:`peak` after, :meth:`remove` at the end."""

    def __init__(self, limit_bytes: int):
        self.limit, self.path, self._procs = int(limit_bytes), None, None

    def make(self) -> bool:
        own = _own_v1()
        if self.limit <= 0 or cgroup_why() or own is None:
            return False
        path = own / f"labkit-grade-{uuid.uuid4().hex[:12]}"
        try:
            path.mkdir()
            (path / "memory.limit_in_bytes").write_text(str(self.limit))
            if (path / "memory.memsw.limit_in_bytes").exists():   # no swapping past it either
                try:
                    (path / "memory.memsw.limit_in_bytes").write_text(str(self.limit))
                except OSError:
                    pass
        except OSError:
            self.remove()
            return False
        self.path, self._procs = path, str(path / "cgroup.procs").encode()
        return True

    def enter(self) -> None:
        """In the child, after fork: move this process into the cgroup (its children follow)."""
        if self._procs is not None:
            fd = os.open(self._procs, os.O_WRONLY)
            try:
                os.write(fd, str(os.getpid()).encode())
            finally:
                os.close(fd)

    def _read(self, name: str) -> str:
        try:
            return (self.path / name).read_text() if self.path else ""
        except OSError:
            return ""

    def oom_kills(self) -> int:
        """Processes the kernel killed for going over the limit (0 without a cgroup)."""
        for line in self._read("memory.oom_control").splitlines():
            if line.startswith("oom_kill "):
                return int(line.split()[1])
        return 0

    def peak(self) -> int:
        text = self._read("memory.max_usage_in_bytes").strip()
        return int(text) if text.isdigit() else 0

    def remove(self) -> None:
        """Remove the cgroup (its processes are dead by now: the run kills and reaps them)."""
        path, self.path, self._procs = self.path, None, None
        if path is not None:
            for _ in range(50):
                try:
                    path.rmdir()
                    return
                except FileNotFoundError:
                    return
                except OSError:                    # a process not yet gone from it
                    import time
                    time.sleep(0.05)


# -- private tmpfs mounts with an inode cap (root only) -------------------------------------------
CLONE_NEWNS, MS_NOSUID, MS_NODEV, MS_REC, MS_PRIVATE = 0x20000, 2, 4, 0x4000, 1 << 18
_LIBC = ctypes.CDLL(None, use_errno=True)


def private_tmpfs(points: list[Path], size: int, files: int) -> None:
    """In the child, after fork: a mount namespace of its own, and a tmpfs of ``size`` bytes and
    ``files`` inodes on each of ``points`` (an OSError if the kernel refuses)."""
    if _LIBC.unshare(CLONE_NEWNS) != 0:
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNS)")
    if _LIBC.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None) != 0:    # nothing leaks to the host
        raise OSError(ctypes.get_errno(), "mount --make-rprivate /")
    opts = f"size={size},nr_inodes={files},mode=1777".encode()
    for p in points:
        if _LIBC.mount(b"tmpfs", str(p).encode(), b"tmpfs", MS_NOSUID | MS_NODEV, opts) != 0:
            raise OSError(ctypes.get_errno(), f"mount tmpfs on {p}")


def inode_cap_why() -> str:
    """"" when :func:`private_tmpfs` works here (tried once in a child), else why not."""
    global _INODE_WHY
    if _INODE_WHY is None:
        if os.geteuid() != 0:
            _INODE_WHY = "the grader is not root (bwrap's --size caps bytes, not files)"
        else:
            import subprocess
            import tempfile
            with tempfile.TemporaryDirectory() as d:
                try:
                    subprocess.run(["true"], check=True, timeout=30,
                                   preexec_fn=lambda: private_tmpfs([Path(d)], 2**20, 16))
                    _INODE_WHY = ""
                except (OSError, subprocess.SubprocessError) as e:
                    _INODE_WHY = f"a private tmpfs could not be mounted ({e})"
    return _INODE_WHY


_INODE_WHY: str | None = None

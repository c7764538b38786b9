"""Where a submission's code runs when grading: a sandbox per exercise, limits, and a clean kill.

Three kinds (``grade --sandbox``), each running ``python -m labkit.check.runner`` in a fresh folder
that holds only a copy of the submission, with the student's code as its only untrusted input:

* ``bwrap`` (default; Debian's ``bubblewrap``): new pid, network, IPC and UTS namespaces; a root
  made of read-only binds of the system (``/usr``, ``/lib*``, ``/bin``, ``/etc``), the Python
  installation, labkit's ``labkit/`` and ``data/`` (nothing else of the checkout: no masters, no
  hidden tests, no instructor's home); the folder the only writable place besides a private
  ``/tmp``; no network but its own loopback; run as ``nobody`` when the grader is root; killed
  with its whole pid namespace when its time is up or the grader dies (``--die-with-parent``).
* ``docker``: the same binds in a container (``--network none --read-only --cap-drop ALL
  --pids-limit``), from an image the instructor builds with labkit's requirements
  (``--image``); removed by name when its time is up.
* ``none``: a plain child process, in its own session and process group, with the limits below,
  the grader made subreaper so that daemons it leaves are found and killed. It can read and
  write whatever the grader's user can: the grader refuses it unless asked explicitly.

Every kind runs with resource limits (:class:`Limits`: CPU time, address space, file size,
processes, open files, no core dumps) and a wall-clock deadline per phase (:func:`run_job`).
"""
from __future__ import annotations

import json
import os
import resource
import selectors
import shutil
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from . import events
from .caps import MemoryCap
from .children import LIVE, children, reap
from .runner_proc import kill_runner, start_runner

KINDS = ("bwrap", "docker", "none")
INSIDE = "/opt/labkit"                     # where labkit/ and data/ appear in the sandbox
# -P: the working folder (the student's) never goes on sys.path; labkit comes from PYTHONPATH, which
# the forkserver of the check's ranks inherits too (Python 3.11's forkserver ignores the parent's sys.path)
RUNNER = ["-P", "-s", "-m", "labkit.check.runner"]


@dataclass(frozen=True)
class Limits:
    cpu_seconds: int = 900                 # RLIMIT_CPU, per process
    memory_bytes: int = 6 * 2**30          # RLIMIT_AS, per process (a gloo rank peaks near 1 GiB)
    file_bytes: int = 256 * 2**20          # RLIMIT_FSIZE
    processes: int = 256                   # RLIMIT_NPROC, for the sandbox's user (not enforced for root)
    open_files: int = 1024                 # RLIMIT_NOFILE
    disk_bytes: int = 256 * 2**20          # bwrap: each of /grade, /tmp, /dev/shm is a tmpfs of this size
    files: int = 4096                      # bwrap as root: inodes of each of those tmpfs (caps.private_tmpfs)
    total_memory_bytes: int = 3 * 2**30    # one run, all processes and tmpfs pages (caps.MemoryCap; 0: none);
                                           # the masters' largest run peaks at 788 MiB (fsdp-tp-mesh)

    def apply(self) -> None:
        """Set them in this process (a child, before exec); inherited by everything it starts."""
        for what, value in ((resource.RLIMIT_CPU, self.cpu_seconds), (resource.RLIMIT_AS, self.memory_bytes),
                            (resource.RLIMIT_FSIZE, self.file_bytes), (resource.RLIMIT_NPROC, self.processes),
                            (resource.RLIMIT_NOFILE, self.open_files), (resource.RLIMIT_CORE, 0)):
            soft, hard = resource.getrlimit(what)
            value = value if hard == resource.RLIM_INFINITY else min(value, hard)
            resource.setrlimit(what, (value, value))


@dataclass
class Sandbox:
    kind: str = "bwrap"
    labkit_root: Path = Path(__file__).resolve().parents[2]    # holds labkit/ and data/
    image: str = ""                                             # docker only
    limits: Limits = Limits()

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"sandbox must be one of {KINDS}, got {self.kind!r}")
        if self.kind == "docker" and not self.image:
            raise ValueError("sandbox 'docker' needs --image (an image with labkit's requirements installed)")
        self.labkit_root = Path(self.labkit_root).resolve()

    def available(self) -> str:
        """"" when this kind can run here, else why not."""
        if self.kind == "none":
            return ""
        if self.kind == "docker":
            if not shutil.which("docker"):
                return "no docker command"
            ok = subprocess.run(["docker", "info"], capture_output=True, timeout=30).returncode == 0
            return "" if ok else "docker is installed but its daemon does not answer (docker info)"
        if not shutil.which("bwrap"):
            return "no bwrap command (Debian package bubblewrap)"
        probe = subprocess.run(["bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc",
                                "--unshare-pid", "--unshare-net", "--die-with-parent", "true"],
                               capture_output=True, text=True, timeout=30)
        return "" if probe.returncode == 0 else f"bwrap cannot run here: {probe.stderr.strip()[:200]}"

    def argv(self, folder: Path, name: str, seccomp_fd: int | None = None, private: bool = False) -> list[str]:
        """The command that runs the runner for one exercise in ``folder`` (bwrap: with the seccomp
        filter read from ``seccomp_fd``, see :mod:`labkit.notebooks.seccomp`; ``private``: its
        writable places are the inode-capped tmpfs mounts the child made, ``caps.private_tmpfs``)."""
        drop = ["--drop-to", "65534:65534"] if os.geteuid() == 0 else []
        if self.kind == "none":
            return [sys.executable, *RUNNER]
        if self.kind == "docker":
            return self._docker(folder, name)
        # the environment's own interpreter (a venv's bin/python), never its realpath: in a venv that
        # is the base interpreter, which does not see the venv's packages (torch missing, master 0/6)
        python, size = os.path.abspath(sys.executable), str(self.limits.disk_bytes)

        def writable(where: str, perms: str, mount: str) -> list[str]:
            if private:                     # a tmpfs of capped bytes and files, mounted by the child
                return ["--bind", str(folder / ".mnt" / mount), where]
            return ["--perms", perms, "--size", size, "--tmpfs", where]
        args = ["bwrap", "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts",
                "--unshare-cgroup-try", "--die-with-parent", "--new-session", "--clearenv",
                "--hostname", "labkit-sandbox", "--dev", "/dev", *writable("/dev/shm", "1777", "shm"),
                "--proc", "/proc", *writable("/tmp", "1777", "tmp")]
        args += ["--seccomp", str(seccomp_fd)] if seccomp_fd is not None else []
        for d in ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc"):
            args += ["--ro-bind-try", d, d]
        made = set()
        prefixes = (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
                    os.path.dirname(os.path.dirname(python)),
                    os.path.dirname(os.path.dirname(os.path.realpath(python))))
        # each as written and resolved: a venv's bin/python links to the base one, by either name
        for prefix in sorted({q for p in prefixes for q in (os.path.abspath(p), os.path.realpath(p))}):
            if prefix.startswith("/usr/"):
                continue
            args += _dirs(Path(prefix).parent, made) + ["--ro-bind", prefix, prefix]
        args += _dirs(Path(INSIDE), made)
        args += ["--ro-bind", str(self.labkit_root / "labkit"), f"{INSIDE}/labkit",
                 "--ro-bind-try", str(self.labkit_root / "data"), f"{INSIDE}/data",
                 *writable("/grade", "0777", "grade"),                            # bytes written: capped, in memory
                 "--ro-bind", str(folder / "submission.ipynb"), "/grade/submission.ipynb", "--chdir", "/grade"]
        for k, v in (("HOME", "/grade"), ("PATH", "/usr/bin:/bin"), ("LABKIT_BACKEND", "gloo"),
                     ("TMPDIR", "/tmp"), ("MPLBACKEND", "Agg"), ("PYTHONDONTWRITEBYTECODE", "1"),
                     ("PYTHONPATH", INSIDE)):
            args += ["--setenv", k, v]
        return args + [python, *RUNNER] + drop

    def _docker(self, folder: Path, name: str) -> list[str]:
        """The docker command: the same limits as bwrap's where docker has them (tmpfs sizes and
        files, one memory cap for the container, no swap, rlimits); docker's default seccomp
        profile stays on (it refuses namespaces, mount, keyctl, bpf; see book/instructors.md)."""
        lim, size = self.limits, self.limits.disk_bytes
        tmpfs = f"rw,nosuid,nodev,size={size},nr_inodes={lim.files},mode=1777"
        mem = str(lim.total_memory_bytes or lim.memory_bytes)
        return ["docker", "run", "--rm", "-i", "--name", name, "--network", "none", "--read-only",
                "--tmpfs", f"/tmp:{tmpfs}", "--tmpfs", f"/grade:{tmpfs}", "--shm-size", str(size),
                "--cap-drop", "ALL", "--security-opt", "no-new-privileges",
                "--pids-limit", str(lim.processes), "--memory", mem, "--memory-swap", mem,
                "--ulimit", f"nofile={lim.open_files}:{lim.open_files}",
                "--ulimit", f"fsize={lim.file_bytes}:{lim.file_bytes}", "--ulimit", "core=0:0",
                "--ulimit", f"cpu={lim.cpu_seconds}:{lim.cpu_seconds}",
                "--user", "65534:65534", "-e", "HOME=/grade", "-e", "LABKIT_BACKEND=gloo",
                "-e", f"PYTHONPATH={INSIDE}", "-w", "/grade",
                "-v", f"{folder / 'submission.ipynb'}:/grade/submission.ipynb:ro",
                "-v", f"{self.labkit_root / 'labkit'}:{INSIDE}/labkit:ro",
                "-v", f"{self.labkit_root / 'data'}:{INSIDE}/data:ro",
                self.image, "python", *RUNNER]


def _dirs(path: Path, made: set) -> list[str]:
    """``--perms 0755 --dir`` for ``path`` and its parents (bwrap makes them 0700 otherwise)."""
    out = []
    for p in reversed([path, *path.parents]):
        if str(p) != "/" and str(p) not in made:
            made.add(str(p))
            out += ["--perms", "0755", "--dir", str(p)]
    return out


# -- running one job ---------------------------------------------------------------------------
class Outcome:
    def __init__(self):
        self.events: list[dict] = []
        self.state = "ok"            # ok | timeout | died | protocol | memory
        self.detail = ""             # which phase timed out, how it died
        self.seconds = 0.0
        self.peak_bytes = 0          # the run's memory peak, all processes (0: no cgroup to measure it)


def run_job(sandbox: Sandbox, folder: Path, job: dict, timeout: float, startup: float = 120.0,
            max_output: int = 256 * 2**20, total: float | None = None) -> Outcome:
    """Run the runner on ``job`` in ``folder``; each phase (start, each answer cell, each case) has
    ``timeout`` seconds (the start ``startup`` more, for imports), the whole run at most ``total``
    (what is left of the submission's time). Everything it started is killed when it ends."""
    out, name = Outcome(), f"labkit-grade-{uuid.uuid4().hex[:12]}"
    folder = Path(folder).resolve()           # a relative --workdir: bwrap and docker need it absolute
    folder.chmod(0o777)                       # the sandbox's user writes here
    before = children()
    t0 = time.monotonic()
    cap = MemoryCap(sandbox.limits.total_memory_bytes if sandbox.kind != "docker" else 0)
    cap.make()
    try:
        proc = start_runner(sandbox, folder, name, cap)
    except BaseException:
        cap.remove()
        raise
    n_cells, n_cases = len(job.get("answers", [])), len(job.get("cases", []))
    expect, seen = {"cell": 0, "case": 0}, set()
    try:
        try:
            proc.stdin.write(json.dumps(job).encode())
            proc.stdin.close()
        except BrokenPipeError:                   # it died before reading its job: said below
            pass
        sel = selectors.DefaultSelector()
        sel.register(proc.stdout, selectors.EVENT_READ)
        hard = t0 + total if total is not None else float("inf")
        buf, total, deadline, phase = bytearray(), 0, time.monotonic() + startup + timeout, "starting and the set-up cells"
        while True:
            left = min(deadline, hard) - time.monotonic()
            if left <= 0:
                out.state, out.detail = "timeout", (phase if deadline <= hard else "the submission's total time")
                break
            if not sel.select(min(left, 1.0)):
                continue
            chunk = os.read(proc.stdout.fileno(), 1 << 20)
            if not chunk:
                break
            total += len(chunk)
            start = len(buf)
            buf += chunk                              # in place: a long line costs its size, once
            if total > max_output or (b"\n" not in chunk and len(buf) > events.MAX_LINE):
                out.state, out.detail = "protocol", (f"more than {max_output} bytes of output" if total > max_output
                                                     else f"a line of more than {events.MAX_LINE} bytes")
                break
            if b"\n" not in chunk:
                continue
            cut = buf.rindex(b"\n", start)
            lines, buf = bytes(buf[:cut]).split(b"\n"), buf[cut + 1:]
            for line in lines:
                try:
                    ev = events.parse(line)
                except events.ProtocolError as e:
                    out.state, out.detail = "protocol", str(e)
                    break
                kind = ev["event"]
                if kind in ("cell", "case"):         # a new phase: only forward, only as many as sent
                    limit = n_cells if kind == "cell" else n_cases
                    if ev["index"] != expect[kind] or expect[kind] >= limit:
                        out.state, out.detail = "protocol", f"unexpected {kind} event"
                        break
                    expect[kind] += 1
                    deadline = time.monotonic() + timeout
                    phase = ev["where"] if kind == "cell" else f"case {ev['index'] + 1}"
                elif kind == "data" and (ev["index"] != expect["case"] - 1 or ev["index"] in seen):
                    out.state, out.detail = "protocol", "data for a case that is not running"   # one per case
                    break
                seen.add(ev["index"] if kind == "data" else None)
                out.events.append(ev)
            if out.state != "ok" or (out.events and out.events[-1]["event"] == "done"):
                break
    finally:
        kill_runner(sandbox, proc, name)
        LIVE.discard(proc.pid)
        reap(before)
        out.seconds = time.monotonic() - t0
        kills, out.peak_bytes = cap.oom_kills(), cap.peak()
        cap.remove()
    if kills:                                  # whatever else it looked like: the kernel killed a process of it
        out.state = "memory"
        out.detail = (f"more than {cap.limit / 2**30:.3g} GiB for all its processes and files together; "
                      f"{kills} process(es) killed")
    elif out.state == "ok" and not (out.events and out.events[-1]["event"] == "done"):
        code = proc.returncode
        out.state = "died"
        out.detail = (f"signal {-code}" if code is not None and code < 0 else f"exit code {code}")
    return out

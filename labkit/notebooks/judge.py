"""The judge in a process of its own, under a memory and a time limit (issue 33, "the judge under limits").

``Spec.verdict`` builds an independent reference from the case and the data a sandbox sent: no
student code runs there, but the *data* is the student's, and a judge that loops or allocates without
bound on it must not stop the grading run. So the grader does not judge in its own process: a
:class:`Judge` keeps one worker (``python -m labkit.notebooks.judge``), started once with the
environment's own interpreter, ``RLIMIT_AS`` of :attr:`JudgeLimits.memory_bytes` on it and on the
ranks it launches, and, where the grader can make one, a cgroup of :attr:`JudgeLimits.total_bytes`
for all of them (:class:`~labkit.notebooks.caps.MemoryCap`). Each verdict is one JSON line each way
and has :attr:`JudgeLimits.seconds`; a verdict over its time, a ``MemoryError`` or a dead worker
raises :class:`JudgeFailure` (that case fails, with the reason), and the worker, with its process
group, is killed and started again for the next verdict.

A Spec that is not the registry's (a test's own) is judged in the calling process.
"""
from __future__ import annotations

import json
import os
import resource
import selectors
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from .caps import MemoryCap
from .children import LIVE, spawn

ROOT = Path(__file__).resolve().parents[2]


class JudgeFailure(RuntimeError):
    """The judge did not give a verdict within its limits (the reason is the message)."""


class JudgeError(Exception):
    """The judge raised (malformed data, or a judge bug): ``"Type: message"`` as the worker said it."""


@dataclass(frozen=True)
class JudgeLimits:
    memory_bytes: int = 6 * 2**30          # RLIMIT_AS of the worker and of each rank it launches
    total_bytes: int = 8 * 2**30           # all of them together, where a cgroup can be made (0: none)
    seconds: float = 120.0                 # one verdict
    startup: float = 300.0                 # the worker's imports (torch), once


class Judge:
    def __init__(self, limits: JudgeLimits = JudgeLimits(), modules: tuple = (), path: tuple = ()):
        self.limits, self.modules, self.path = limits, tuple(modules), tuple(str(p) for p in path)
        self._proc, self._cap, self._lock = None, None, threading.Lock()

    # -- the worker's life ------------------------------------------------------------------------
    def _start(self) -> None:
        lim, cap = self.limits, MemoryCap(self.limits.total_bytes)
        cap.make()

        def child() -> None:
            cap.enter()
            resource.setrlimit(resource.RLIMIT_AS, (lim.memory_bytes, lim.memory_bytes))
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        env = {k: v for k, v in os.environ.items() if not k.startswith(("LABKIT_LIVE", "PYTHON"))}
        env.update(PYTHONPATH=os.pathsep.join([str(ROOT), *self.path]), LABKIT_BACKEND="gloo", MPLBACKEND="Agg")
        self._proc = spawn([sys.executable, "-s", "-m", "labkit.notebooks.judge", *self.modules],
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                           start_new_session=True, preexec_fn=child, env=env)
        self._cap = cap
        if self._read(time.monotonic() + lim.startup) != {"ready": True}:
            self.stop()
            raise JudgeFailure("the judge's process did not start")

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)        # the worker and any ranks it launched
            except (ProcessLookupError, PermissionError):
                pass
            proc.wait()
            LIVE.discard(proc.pid)
            for stream in (proc.stdin, proc.stdout):
                stream.close()
        if self._cap is not None:
            self._cap.remove()
            self._cap = None

    def _read(self, deadline: float):
        """One JSON line from the worker before ``deadline``; None at its end, "timeout" past it."""
        fd, buf = self._proc.stdout.fileno(), bytearray()
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_READ)
            while b"\n" not in buf:
                left = deadline - time.monotonic()
                if left <= 0:
                    return "timeout"
                if sel.select(min(left, 1.0)):
                    chunk = os.read(fd, 1 << 20)
                    if not chunk:
                        return None
                    buf += chunk
        return json.loads(bytes(buf).split(b"\n", 1)[0])

    # -- one verdict ------------------------------------------------------------------------------
    def verdict(self, spec, data, case: dict) -> dict:
        """{name, passed, message, hint} of ``spec.verdict(wire.decode(data), **case)``, judged in
        the worker within the limits; :class:`JudgeFailure` when it was not."""
        from labkit.check import wire
        from labkit.check.registry import MODULES, find
        if find(spec.id, MODULES + self.modules) is not spec:      # a test's own Spec: here
            import contextlib
            import io
            with contextlib.redirect_stdout(io.StringIO()):
                v = spec.verdict(wire.decode(data), **case)
            return {"name": v.name, "passed": bool(v.passed), "message": v.message, "hint": v.hint}
        line = json.dumps({"id": spec.id, "case": case, "data": data}).encode() + b"\n"
        with self._lock:
            if self._proc is None or self._proc.poll() is not None:
                self.stop()
                self._start()
            try:
                self._proc.stdin.write(line)
                self._proc.stdin.flush()
                reply = self._read(time.monotonic() + self.limits.seconds)
            except (BrokenPipeError, ValueError):
                reply = None
            why = self._failure(reply)
            if why:
                self.stop()
                raise JudgeFailure(why)
        if "error" in reply:
            raise JudgeError(reply["error"])
        return reply

    def _failure(self, reply) -> str:
        lim = self.limits
        if reply == "timeout":
            return f"the judge ran over its time limit ({lim.seconds:g} s) and was stopped"
        if reply is None or reply.get("error") == "MemoryError":
            killed = self._cap is not None and self._cap.oom_kills()
            return (f"the judge ran out of its memory limit ({lim.memory_bytes / 2**30:.3g} GiB per process"
                    + (f", {lim.total_bytes / 2**30:.3g} GiB in all" if self._cap and self._cap.path else "")
                    + ")" + ("" if reply is not None or killed else " or its process died"))
        return ""


_DEFAULT: Judge | None = None


def default() -> Judge:
    """The grader's process-wide judge (its worker started on first use, stopped at exit)."""
    global _DEFAULT
    if _DEFAULT is None:
        import atexit
        _DEFAULT = Judge()
        atexit.register(_DEFAULT.stop)
    return _DEFAULT


def main(argv=None) -> int:
    """The worker: one request line in, one verdict line out, until stdin ends."""
    import contextlib
    import io
    argv = sys.argv[1:] if argv is None else argv
    out = os.fdopen(os.dup(1), "w", buffering=1)
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)                                   # what a judge prints goes nowhere
    from labkit.check import wire
    from labkit.check.registry import MODULES, all_specs
    specs = all_specs(MODULES + tuple(argv))
    out.write('{"ready": true}\n')
    for line in sys.stdin.buffer:
        try:
            req = json.loads(line)
            with contextlib.redirect_stdout(io.StringIO()):
                v = specs[req["id"]].verdict(wire.decode(req["data"]), **req["case"])
            reply = {"name": str(v.name), "passed": bool(v.passed), "message": str(v.message), "hint": str(v.hint)}
        except MemoryError:
            reply = {"error": "MemoryError"}
        except OSError as e:                           # ENOMEM from mmap and friends: the same limit
            reply = {"error": "MemoryError" if e.errno == 12 else f"OSError: {str(e)[:200]}"}
        except Exception as e:  # noqa: BLE001 - malformed data, or a judge bug: that case's error
            reply = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
        out.write(json.dumps(reply) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

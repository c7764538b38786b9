"""The caller side of :mod:`labkit.launcher`: wait for the ranks, name the failing one, stop all.

Ranks report on one queue: ``("msg", rank, obj)`` from ``send_to_parent``, then ``("ok", rank,
pickled result)`` or ``("error", rank, traceback)``. A rank that dies without a word (segfault,
``os._exit``) is found by its exit code. After the first failure the others get a moment to
report, so that the root cause, not a peer's "connection closed", is the error raised.

Before any rank starts, :func:`check_capacity` refuses a world the machine cannot hold: the open
files the caller needs per rank against ``ulimit -n``, and the memory every rank needs against the
memory available now, each message naming the numbers.
"""
from __future__ import annotations

import os
import queue as queue_mod
import time

import cloudpickle

MIB, GIB = 2 ** 20, 2 ** 30
# A forked gloo rank that has trained labkit's default model holds 27 MiB of its own memory
# (Private_Dirty, /proc/PID/smaps_rollup), torch's ~200 MiB being shared with the forkserver;
# 20 MiB keeps the check a lower bound. The forkserver itself (torch imported): ~290 MiB RSS.
RANK_BASE_BYTES, FORKSERVER_BYTES = 20 * MIB, 256 * MIB
FDS_PER_RANK, FDS_SPARE = 6, 64   # in the caller: 8 ranks opened 44 (sentinels, logs, store sockets)


def available_memory() -> int | None:
    """Bytes of memory available to new processes now: Linux's MemAvailable, else (macOS, BSD) the
    physical memory (an upper bound), else None (unknown: no check)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def check_capacity(world_size: int, rank_bytes: float = 0.0, memory: int | None = None,
                   open_files: int | None = None) -> None:
    """Refuse a world this machine cannot hold, before anything is forked: ``world_size`` x
    FDS_PER_RANK open files in the caller against the soft ``RLIMIT_NOFILE``, and ``world_size``
    x (RANK_BASE_BYTES + ``rank_bytes``) + FORKSERVER_BYTES against the available memory.
    ``rank_bytes``: what one rank holds besides the process (``labkit.preflight``: parameters,
    gradients, optimizer states and activations per labkit.calc, CPU ranks only)."""
    memory = available_memory() if memory is None else memory
    per_rank = RANK_BASE_BYTES + rank_bytes
    need = world_size * per_rank + FORKSERVER_BYTES
    if memory is not None and need > memory:
        raise ValueError(f"world_size {world_size}: {world_size} ranks need at least {need / GIB:,.1f} GiB "
                         f"({per_rank / MIB:,.0f} MiB per rank: {RANK_BASE_BYTES / MIB:.0f} MiB for the "
                         f"process + {rank_bytes / MIB:,.0f} MiB of parameters, gradients, optimizer "
                         f"states and activations), more than the {memory / GIB:.1f} GiB this machine "
                         f"has available")
    if open_files is None:
        try:
            import resource
            open_files = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        except (ImportError, ValueError, OSError):
            open_files = None
    need_files = world_size * FDS_PER_RANK + FDS_SPARE
    if open_files is not None and 0 <= open_files < need_files:
        raise ValueError(f"world_size {world_size}: {world_size} ranks need about {need_files} open files "
                         f"in this process ({FDS_PER_RANK} per rank), more than its limit {open_files} "
                         f"(ulimit -n)")


class RankFailed(RuntimeError):
    """A rank raised (or died). ``.rank``, ``.remote_traceback`` and ``.output`` say what happened."""

    def __init__(self, rank: int, remote_traceback: str, output: str):
        self.rank, self.remote_traceback, self.output = rank, remote_traceback, output
        shown = output.strip()[-4000:] or "(nothing)"
        super().__init__(f"rank {rank} failed:\n{remote_traceback.rstrip()}\n"
                         f"--- captured output of rank {rank} ---\n{shown}")

    def details(self) -> str:
        """The traceback, then the rank's output without its own copy of that traceback."""
        tb = self.remote_traceback.split("\n(ranks ")[0].strip()
        output = self.output.replace(tb, "(the traceback above)") if tb else self.output
        return f"{self.remote_traceback.rstrip()}\n--- captured output of rank {self.rank} ---\n" \
               f"{output.strip()[-4000:] or '(nothing)'}"

    @property
    def summary(self) -> str:
        """One line: the rank and its error, e.g. "rank 1 failed: ValueError: corpus ... too short"."""
        lines = [ln.strip() for ln in self.remote_traceback.split("\n(ranks ")[0].splitlines() if ln.strip()]
        return f"rank {self.rank} failed: {lines[-1] if lines else 'no error message'}"


class LaunchTimeout(TimeoutError):
    """Some ranks did not finish within the launch timeout; all ranks were stopped."""

    def __init__(self, unfinished: list[int], timeout: float, outputs: dict[int, str], waits=None):
        from .debug.stacks import describe
        self.unfinished, self.waits = unfinished, waits or {}   # {rank: where it waits} (debug/stacks.py)
        tails = "".join(f"\n--- captured output of rank {r} ---\n{outputs[r].strip()[-1500:] or '(nothing)'}"
                        for r in unfinished[:4])
        report = "".join(f"\n  {describe(r, self.waits.get(r))}" for r in unfinished) if waits is not None else ""
        super().__init__(f"ranks {unfinished} did not finish within {timeout:g} s; all ranks were "
                         f"stopped (a hang is usually a collective that not every rank reached){report}{tails}")


def _read_from(log, offset: int = 0) -> tuple[str, int]:
    """(text, new offset) of a rank's log from ``offset``: a path, or an open file the rank writes
    through a shared descriptor (read with pread: the shared file offset must not move)."""
    if isinstance(log, (str, os.PathLike)):
        with open(log, "rb") as f:
            f.seek(offset)
            data = f.read()
    else:
        chunks = []
        while chunk := os.pread(log.fileno(), 1 << 20, offset + sum(map(len, chunks))):
            chunks.append(chunk)
        data = b"".join(chunks)
    return data.decode(errors="replace"), offset + len(data)


class LiveOutput:
    """Print what ranks write to their logs (paths or open files) as it comes, each line
    prefixed ``[rank r]``."""

    def __init__(self, logs, write=None):
        self.logs, self.offsets, self.partial = logs, [0] * len(logs), [""] * len(logs)
        self.write = write or (lambda line: print(line, flush=True))

    def poll(self, final: bool = False) -> None:
        for r, log in enumerate(self.logs):
            try:
                text, self.offsets[r] = _read_from(log, self.offsets[r])
            except (OSError, ValueError):
                continue
            *lines, self.partial[r] = (self.partial[r] + text).split("\n")
            if final and self.partial[r]:
                lines, self.partial[r] = lines + [self.partial[r]], ""
            for line in lines:
                self.write(f"[rank {r}] {line}")


_COLLATERAL = ("Connection closed by peer", "Connection reset by peer", "remote worker",
               "Broken pipe", "Socket Timeout")  # a rank failing because another one died


def collect(procs, results_q, logs, timeout, on_message, live=None) -> list:
    """Results in rank order, or RankFailed / LaunchTimeout (after stopping every rank)."""
    world_size = len(procs)
    results, failures, deadline = {}, {}, time.monotonic() + timeout
    while len(results) < world_size:
        if live is not None:
            live.poll()
        try:
            kind, rank, body = results_q.get(timeout=0.05)
        except queue_mod.Empty:
            _find_dead(procs, results, failures)  # died without reporting (segfault, os._exit)
            if failures:
                _drain(procs, results, results_q, failures, on_message, seconds=0.5)
                stop(procs)
                raise _first_cause(failures, logs)
            if time.monotonic() > deadline:
                unfinished = [r for r in range(world_size) if r not in results]
                waits = dump_stacks(procs, unfinished, logs)   # before stopping: where each waits
                stop(procs)
                raise LaunchTimeout(unfinished, timeout, {r: _read(logs[r]) for r in unfinished}, waits)
            continue
        if kind == "msg":
            if on_message is not None:
                on_message(body)
        elif kind == "ok":
            results[rank] = cloudpickle.loads(body)
        else:  # "error": give the other ranks a moment to report, then name the root cause
            failures[rank] = body
            _drain(procs, results, results_q, failures, on_message, seconds=1.0)
            stop(procs)
            raise _first_cause(failures, logs)
    return [results[r] for r in range(world_size)]


def _find_dead(procs, results, failures) -> None:
    """A rank that exited with an error code and no result. (Exit code 0 means its result is
    still in the pipe: it is read on the next turn.)"""
    for r, p in enumerate(procs):
        if r not in results and r not in failures and p.exitcode not in (None, 0):
            failures[r] = f"process exited with code {p.exitcode} without a result{_signal_hint(p.exitcode)}"


_HINTS = {"SIGKILL": "the out-of-memory killer, or a kill -9", "SIGBUS": "a memory-mapped file (a "
          ".bin?) shrank while in use", "SIGSEGV": "a crash in native code"}


def _signal_hint(exitcode: int) -> str:
    """" (killed by SIGBUS: ...)" for a negative exit code; the rank's output holds faulthandler's
    Python traceback for SIGBUS and SIGSEGV."""
    if exitcode >= 0:
        return ""
    import signal
    try:
        name = signal.Signals(-exitcode).name
    except ValueError:
        return ""
    return f" (killed by {name}{': ' + _HINTS[name] if name in _HINTS else ''})"


def _drain(procs, results, results_q, failures, on_message, seconds):
    """Collect the other ranks' reports for a moment, so the root cause can be named."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            kind, rank, body = results_q.get(timeout=0.05)
        except queue_mod.Empty:
            _find_dead(procs, results, failures)
            continue
        if kind == "error":
            failures.setdefault(rank, body)
        elif kind == "msg" and on_message is not None:
            on_message(body)


def _first_cause(failures, logs) -> RankFailed:
    """The rank whose failure is not a consequence of another's (peer closed the connection)."""
    def collateral(tb):
        return any(k in tb for k in _COLLATERAL)
    causes = sorted(r for r, tb in failures.items() if not collateral(tb)) or sorted(failures)
    rank = causes[0]
    others = sorted(r for r in failures if r != rank)
    tb = failures[rank] + (f"\n(ranks {others} failed too, after rank {rank})" if others else "")
    return RankFailed(rank, tb, _read(logs[rank]))


def stop(procs) -> None:
    """Terminate every rank still alive, then kill what is left; join all."""
    for p in procs:
        if p.is_alive():
            p.terminate()
    end = time.monotonic() + 3.0
    for p in procs:
        if p.pid is not None:
            p.join(max(0.0, end - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join(1.0)


def dump_stacks(procs, ranks, logs, wait: float = 1.0) -> dict:
    """Ask each rank in ``ranks`` for its Python stacks (SIGUSR1: faulthandler, registered by
    launch_rank) and read where it waits ({rank: labkit.debug.stacks.waits_from_stacks(...)})."""
    import signal

    from .debug.stacks import waits_from_stacks
    if not hasattr(signal, "SIGUSR1"):
        return {}
    before = {r: len(_read(logs[r])) for r in ranks}
    for r in ranks:
        if procs[r].is_alive() and procs[r].pid:
            try:
                os.kill(procs[r].pid, signal.SIGUSR1)
            except OSError:
                pass
    end, last = time.monotonic() + wait, None
    while time.monotonic() < end:               # until every dump is in and no longer growing
        time.sleep(0.05)
        now = {r: _read(logs[r])[before[r]:] for r in ranks}
        if now == last and all("most recent call first" in t for t in now.values()):
            break
        last = now
    return {r: waits_from_stacks(text) for r, text in (last or {}).items()}


def _read(log) -> str:
    try:
        return _read_from(log)[0]
    except (OSError, ValueError):
        return ""

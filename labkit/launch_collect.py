"""The caller side of :mod:`labkit.launcher`: wait for the ranks, name the failing one, stop all.

Ranks report on one queue: ``("msg", rank, obj)`` from ``send_to_parent``, then ``("ok", rank,
pickled result)`` or ``("error", rank, traceback)``. A rank that dies without a word (segfault,
``os._exit``) is found by its exit code. After the first failure the others get a moment to
report, so that the root cause, not a peer's "connection closed", is the error raised.
"""
from __future__ import annotations

import queue as queue_mod
import time

import cloudpickle


class RankFailed(RuntimeError):
    """A rank raised (or died). ``.rank``, ``.remote_traceback`` and ``.output`` say what happened."""

    def __init__(self, rank: int, remote_traceback: str, output: str):
        self.rank, self.remote_traceback, self.output = rank, remote_traceback, output
        shown = output.strip()[-4000:] or "(nothing)"
        super().__init__(f"rank {rank} failed:\n{remote_traceback.rstrip()}\n"
                         f"--- captured output of rank {rank} ---\n{shown}")


class LaunchTimeout(TimeoutError):
    """Some ranks did not finish within the launch timeout; all ranks were stopped."""

    def __init__(self, unfinished: list[int], timeout: float, outputs: dict[int, str]):
        self.unfinished = unfinished
        tails = "".join(f"\n--- captured output of rank {r} ---\n{outputs[r].strip()[-1500:] or '(nothing)'}"
                        for r in unfinished[:4])
        super().__init__(f"ranks {unfinished} did not finish within {timeout:g} s; all ranks were "
                         f"stopped (a hang is usually a collective that not every rank reached){tails}")


class LiveOutput:
    """Print what ranks write to their log files as it comes, each line prefixed ``[rank r]``."""

    def __init__(self, logs, write=None):
        self.logs, self.offsets, self.partial = logs, [0] * len(logs), [""] * len(logs)
        self.write = write or (lambda line: print(line, flush=True))

    def poll(self, final: bool = False) -> None:
        for r, path in enumerate(self.logs):
            try:
                with open(path, errors="replace") as f:
                    f.seek(self.offsets[r])
                    text = f.read()
                    self.offsets[r] = f.tell()
            except OSError:
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
                stop(procs)
                unfinished = [r for r in range(world_size) if r not in results]
                raise LaunchTimeout(unfinished, timeout, {r: _read(logs[r]) for r in unfinished})
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
            failures[r] = f"process exited with code {p.exitcode} without a result"


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


def _read(path: str) -> str:
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""

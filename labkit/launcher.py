"""Run one function on N ranks: the only place that knows about processes, backends and devices.

    results = launch(fn, 4, x, y=2)   # fn(x, y=2) runs on ranks 0..3; results[r] is rank r's value

* From a notebook or a script: spawns ``world_size`` processes (``fn`` may be defined in a notebook
  cell: it is shipped by value with cloudpickle). Rendezvous goes through a TCPStore the caller
  opens on 127.0.0.1 at a free port, so parallel test runs never collide on a fixed port.
* Under ``torchrun`` (RANK and WORLD_SIZE set): runs ``fn`` in this process and all-gathers the
  results, so the same notebook code runs one rank per GPU on a node, or across nodes.
* Backend is chosen once, here: NCCL with one GPU per rank when there are enough GPUs, else gloo
  on CPU. Everything else uses ``tensor.device`` (see :func:`device`).

Failures become one exception in the caller: :class:`RankFailed` names the rank, its traceback and
its captured output, after every other rank is stopped; :class:`LaunchTimeout` names the ranks that
did not finish. Ranks' own prints are captured to files, never to the notebook; they come back in
the error message when something goes wrong.

Processes are forked from a forkserver that has imported torch once, so a launch costs a fraction
of a second after the first (README, "Benchmarks").
"""
from __future__ import annotations

import atexit
import contextlib
import datetime
import multiprocessing as mp
import os
import queue as queue_mod
import sys
import tempfile
import time
import traceback

import cloudpickle
import torch
import torch.distributed as dist

__all__ = ["launch", "device", "send_to_parent", "RankFailed", "LaunchTimeout", "resolve_backend"]

DEFAULT_TIMEOUT = 300.0  # seconds for the whole launch
_channel = None  # (queue, rank) inside a spawned rank; lets ranks stream log lines to the caller


class RankFailed(RuntimeError):
    """A rank raised (or died). ``.rank``, ``.remote_traceback`` and ``.output`` say what happened."""

    def __init__(self, rank: int, remote_traceback: str, output: str):
        self.rank, self.remote_traceback, self.output = rank, remote_traceback, output
        shown = output.strip()[-4000:] or "(nothing)"
        super().__init__(f"rank {rank} failed:\n{remote_traceback.rstrip()}\n"
                         f"--- captured output of rank {rank} ---\n{shown}")


class LaunchTimeout(TimeoutError):
    """Some ranks did not finish within the timeout; all ranks were stopped."""

    def __init__(self, unfinished: list[int], timeout: float, outputs: dict[int, str]):
        self.unfinished = unfinished
        tails = "".join(f"\n--- captured output of rank {r} ---\n{outputs[r].strip()[-1500:] or '(nothing)'}"
                        for r in unfinished[:4])
        super().__init__(f"ranks {unfinished} did not finish within {timeout:g} s; all ranks were "
                         f"stopped (a hang is usually a collective that not every rank reached){tails}")


# --------------------------------------------------------------------------------------------
def resolve_backend(backend: str, world_size: int) -> str:
    """"auto" -> "nccl" when CUDA has >= world_size devices, else "gloo"."""
    if backend == "auto":
        return "nccl" if torch.cuda.is_available() and torch.cuda.device_count() >= world_size else "gloo"
    if backend == "nccl" and not (torch.cuda.is_available() and torch.cuda.device_count() >= world_size):
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        raise ValueError(f"backend 'nccl' needs one GPU per rank: world_size {world_size}, GPUs {n}")
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"backend must be 'auto', 'gloo' or 'nccl', got {backend!r}")
    return backend


def device() -> torch.device:
    """This rank's device: its GPU under NCCL, else the CPU."""
    if dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def send_to_parent(obj) -> None:
    """Stream ``obj`` (e.g. a log line) to the caller of :func:`launch`, which prints it at once.

    Outside a spawned rank (torchrun, or a plain process) rank 0 prints it itself.
    """
    if _channel is not None:
        q, rank = _channel
        q.put(("msg", rank, obj))
    elif not dist.is_initialized() or dist.get_rank() == 0:
        print(obj, flush=True)


# --------------------------------------------------------------------------------------------
def launch(fn, world_size: int, *args, backend: str = "auto", timeout: float = DEFAULT_TIMEOUT,
           on_message=print, **kwargs) -> list:
    """Run ``fn(*args, **kwargs)`` on ``world_size`` ranks; return their results in rank order."""
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be a positive integer, got {world_size!r}")
    if not timeout or timeout <= 0:
        raise ValueError(f"timeout must be > 0 seconds, got {timeout!r}")
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return _run_in_process(fn, world_size, args, kwargs, backend)
    backend = resolve_backend(backend, world_size)

    store = dist.TCPStore("127.0.0.1", 0, world_size + 1, is_master=True, wait_for_workers=False,
                          timeout=datetime.timedelta(seconds=timeout))
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "torch.distributed", "cloudpickle"])
    results_q = ctx.Queue()
    payload = cloudpickle.dumps((fn, args, kwargs))
    logdir = tempfile.mkdtemp(prefix="labkit-launch-")
    logs = [os.path.join(logdir, f"rank{r}.log") for r in range(world_size)]
    procs = [ctx.Process(target=_rank_main, daemon=True,
                         args=(r, world_size, backend, store.port, timeout, payload, results_q, logs[r]))
             for r in range(world_size)]
    try:
        with _main_module_hidden():
            for p in procs:
                p.start()
        return _collect(procs, results_q, logs, timeout, on_message)
    finally:
        _stop(procs)
        results_q.close()
        for path in logs:
            if os.path.exists(path):
                os.remove(path)
        os.rmdir(logdir)
        del store


_COLLATERAL = ("Connection closed by peer", "Connection reset by peer", "remote worker",
               "Broken pipe", "Socket Timeout")  # a rank failing because another one died


def _collect(procs, results_q, logs, timeout, on_message):
    world_size = len(procs)
    results, failures, deadline = {}, {}, time.monotonic() + timeout
    while len(results) < world_size:
        try:
            kind, rank, body = results_q.get(timeout=0.05)
        except queue_mod.Empty:
            _find_dead(procs, results, failures)  # died without reporting (segfault, os._exit)
            if failures:
                _drain(procs, results, results_q, failures, on_message, seconds=0.5)
                _stop(procs)
                raise _first_cause(failures, logs)
            if time.monotonic() > deadline:
                _stop(procs)
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
            _stop(procs)
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


@contextlib.contextmanager
def _main_module_hidden():
    """Keep multiprocessing from re-running the caller's ``__main__`` in each rank.

    ``fn`` travels by value (cloudpickle), so ranks never need the caller's script; re-running an
    unguarded script would launch again from inside a rank.
    """
    main = sys.modules["__main__"]
    saved = {k: main.__dict__.pop(k) for k in ("__file__", "__spec__") if k in main.__dict__}
    main.__spec__ = None
    try:
        yield
    finally:
        main.__dict__.pop("__spec__", None)
        main.__dict__.update(saved)


def _stop(procs) -> None:
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


def _rank_main(rank, world_size, backend, port, timeout, payload, results_q, log_path):
    """Entry point of a spawned rank: capture output, join the group, run, report."""
    global _channel
    log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    sys.stdout.reconfigure(line_buffering=True)
    sys.stderr.reconfigure(line_buffering=True)
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world_size),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.set_num_threads(1)  # N ranks share the cores; also makes CPU sums reproducible
    _channel = (results_q, rank)
    try:
        if backend == "nccl":
            torch.cuda.set_device(rank)
        store = dist.TCPStore("127.0.0.1", port, world_size + 1, is_master=False,
                              timeout=datetime.timedelta(seconds=timeout))
        dist.init_process_group(backend, store=store, rank=rank, world_size=world_size,
                                timeout=datetime.timedelta(seconds=timeout))
        dist.barrier()  # every rank has finished connecting before any rank may finish and leave
        fn, args, kwargs = cloudpickle.loads(payload)
        out = fn(*args, **kwargs)
        dist.barrier()  # nobody tears down its connections while a peer still uses them
        results_q.put(("ok", rank, cloudpickle.dumps(out)))
    except BaseException:  # noqa: BLE001 - every failure must reach the caller
        tb = traceback.format_exc()
        print(tb, file=sys.stderr)
        results_q.put(("error", rank, tb))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        results_q.close()
        results_q.join_thread()


def _run_in_process(fn, world_size, args, kwargs, backend):
    """Under torchrun: this process is one rank; run fn here and all-gather the results."""
    env_world = int(os.environ["WORLD_SIZE"])
    if env_world != world_size:
        raise ValueError(f"launch(world_size={world_size}) under torchrun with WORLD_SIZE={env_world}")
    if not dist.is_initialized():
        backend = resolve_backend(backend, int(os.environ.get("LOCAL_WORLD_SIZE", world_size)))
        if backend == "nccl":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        dist.init_process_group(backend)
        atexit.register(_leave_together)  # a live group torn down at exit aborts the process
    out = fn(*args, **kwargs)
    gathered = [None] * world_size
    dist.all_gather_object(gathered, out)
    return gathered


def _leave_together() -> None:
    """At exit under torchrun: wait for every rank, then close the group we opened."""
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()

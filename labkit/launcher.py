"""Run one function on N ranks: the only place that knows about processes, backends and devices.

    results = launch(fn, 4, x, y=2)   # fn(x, y=2) runs on ranks 0..3; results[r] is rank r's value

* From a notebook or a script: spawns ``world_size`` processes (``fn`` may be defined in a notebook
  cell: it is shipped by value with cloudpickle). Rendezvous goes through a TCPStore the caller
  opens on 127.0.0.1 at a free port. Each launch passes the caller's environment *as it is now* to
  its ranks (``CUDA_VISIBLE_DEVICES``, ``NCCL_DEBUG``, ... set after the first launch apply).
* Under ``torchrun`` (``TORCHELASTIC_RUN_ID`` set, or RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and
  MASTER_PORT all set): runs ``fn`` in this process and all-gathers the results, so the same code
  runs one rank per GPU on a node, or across nodes (several torchrun agents).
* **Backend and device, decided once.** ``backend="gloo"`` runs CPU ranks (what CPU-only code must
  ask for), ``"nccl"`` one GPU per rank, ``"cpu:gloo,cuda:nccl"`` both (CPU tensors over gloo).
  ``backend="auto"`` is resolved by the FIRST auto launch of the process, from that launch's world
  size (NCCL if there is a GPU per rank, else gloo) and then kept for every later auto launch of
  any world size, so that comparisons across world sizes never mix devices; a later auto launch
  larger than the GPU count is refused. Override: ``LABKIT_BACKEND=gloo|nccl`` in the environment
  (read at that first launch), ``choose_backend(...)`` before it, or ``backend=`` per launch.
  :func:`backend_in_use` says which; with GPUs visible a one-line notice says so at that first
  launch. In a rank, :func:`device` is the device to put every tensor on.
* ranks run with TF32 off (``allow_tf32=True`` to opt in): see :mod:`labkit.launch_rank`.
* Results come back on the CPU (tensors moved inside the rank; see ``launch_rank.to_cpu``).

Two timeouts: ``timeout`` is the wall clock of the whole launch (then :class:`LaunchTimeout`, all
ranks stopped); ``collective_timeout`` is how long one collective may wait for its peers (the
process group's timeout, NCCL's watchdog), after which that rank fails (:class:`RankFailed`).

Failures become one exception in the caller: :class:`RankFailed` names the rank, its traceback and
its captured output, after every other rank is stopped (``.summary``: one line). Ranks' prints are
captured to unnamed temporary files, not shown, and come back in the error message;
``live_output=True`` (or ``LABKIT_LIVE_OUTPUT=1``) also prints them as they come, each line prefixed
``[rank r]``, for debugging. A world the machine cannot hold is refused before anything is forked
(``launch_collect.check_capacity``), and nothing outlives a killed caller (``launch_rank``).

Honest timings: :func:`synchronize` waits for queued GPU work (nothing on CPU); :func:`timer` and
:func:`now` read the wall clock after it. Processes are forked from a forkserver that has imported
torch once, so a launch costs a fraction of a second after the first (README, "Benchmarks").
"""
from __future__ import annotations

import atexit
import contextlib
import dataclasses
import datetime
import math
import multiprocessing as mp
import os
import sys
import tempfile
import time

import cloudpickle
import torch
import torch.distributed as dist

from . import launch_rank
from .launch_collect import LaunchTimeout, LiveOutput, RankFailed, check_capacity, collect, stop
from .launch_rank import state, to_cpu
from .torchrun_store import generation_store
from .validate import positive_int

__all__ = ["launch", "device", "backend_in_use", "choose_backend", "resolve_backend", "synchronize",
           "timer", "now", "send_to_parent", "under_torchrun", "to_cpu", "RankFailed", "LaunchTimeout"]

DEFAULT_TIMEOUT = 300.0             # seconds for the whole launch
DEFAULT_COLLECTIVE_TIMEOUT = 600.0  # seconds one collective may wait (PyTorch's NCCL default)
BACKENDS = ("gloo", "nccl", "cpu:gloo,cuda:nccl")
_auto = None  # the backend "auto" stands for in this process, once decided


# --------------------------------------------------------------------------------------------
def gpu_count() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def resolve_backend(backend: str, world_size: int) -> str:
    """"auto" -> "nccl" when CUDA has >= world_size devices, else "gloo"; checks explicit names."""
    n = gpu_count()
    if backend == "auto":
        return "nccl" if n >= world_size else "gloo"
    if backend not in BACKENDS:
        raise ValueError(f"backend must be 'auto' or one of {BACKENDS}, got {backend!r}")
    if launch_rank.uses_cuda(backend) and n < world_size:
        raise ValueError(f"backend {backend!r} needs one GPU per rank: world_size {world_size}, GPUs {n}")
    return backend


def choose_backend(backend: str | None) -> None:
    """Fix what ``backend="auto"`` means in this process ("gloo" or "nccl"); None forgets it."""
    global _auto
    if backend is not None and backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS} or None, got {backend!r}")
    _auto = backend


def backend_in_use() -> str | None:
    """In a rank: its backend. Elsewhere: what "auto" stands for in this process (None: undecided)."""
    return state.backend if state.backend is not None else _auto


def _auto_backend(world_size: int) -> str:
    global _auto
    if _auto is None:
        wanted = os.environ.get("LABKIT_BACKEND", "auto").strip() or "auto"
        _auto = resolve_backend(wanted, world_size)
        n = gpu_count()
        if n:  # without a GPU there is no choice to tell about
            print(f"labkit.launch: backend 'auto' is {_auto!r} for every launch of this process "
                  f"(decided at world size {world_size}, {n} GPU(s) visible"
                  f"{', LABKIT_BACKEND=' + wanted if wanted != 'auto' else ''}); override with "
                  f"LABKIT_BACKEND, labkit.launcher.choose_backend() or launch(backend=...)",
                  file=sys.stderr, flush=True)
    if launch_rank.uses_cuda(_auto) and gpu_count() < world_size:
        raise ValueError(f"backend 'auto' is {_auto!r} in this process (decided by its first launch) "
                         f"but world_size {world_size} > {gpu_count()} GPUs; pass backend='gloo' "
                         f"for CPU ranks, or choose_backend('gloo') for every launch")
    return _auto


def under_torchrun(env=None) -> bool:
    """True under torchrun (or another env:// launcher): this process is already one rank."""
    env = os.environ if env is None else env
    return "TORCHELASTIC_RUN_ID" in env or all(
        k in env for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"))


def device() -> torch.device:
    """This rank's device: its GPU (``cuda:LOCAL_RANK``) when its backend has NCCL, else the CPU."""
    if state.device is not None:
        return state.device
    if dist.is_initialized() and "nccl" in str(dist.get_backend()):  # a group someone else made
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def synchronize(dev=None) -> None:
    """Wait for all queued work on ``dev`` (default: :func:`device`) if it is a GPU; else nothing."""
    dev = device() if dev is None else torch.device(dev)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def now(dev=None) -> float:
    """``time.perf_counter()`` after :func:`synchronize`: a timestamp that includes queued GPU work."""
    synchronize(dev)
    return time.perf_counter()


@dataclasses.dataclass
class Timing:
    seconds: float | None = None   # set when the ``with`` block ends


@contextlib.contextmanager
def timer(dev=None):
    """``with timer() as t: work()`` -> ``t.seconds``: wall time of ``work`` including its GPU kernels.

    Synchronizes before and after (on CUDA), so the time is neither that of kernel launches only
    (CUDA is asynchronous; NCCL calls return at enqueue) nor polluted by earlier queued work.
    """
    t = Timing()
    start = now(dev)
    yield t
    t.seconds = now(dev) - start


def send_to_parent(obj) -> None:
    """Stream ``obj`` (e.g. a log line) to the caller of :func:`launch`, which prints it at once.

    Outside a spawned rank (torchrun, or a plain process) rank 0 prints it itself.
    """
    if state.channel is not None:
        q, rank = state.channel
        q.put(("msg", rank, to_cpu(obj)))
    elif not dist.is_initialized() or dist.get_rank() == 0:
        print(obj, flush=True)


# What a rank of labkit.train imports besides torch (inside functions): imported once in the
# forkserver, every rank forked from it has them (0.2-0.3 s of CPU per rank; measured 2026-11-28)
RANK_MODULES = ("labkit.training", "labkit.model", "labkit.parallelize", "labkit.checkpoint.run",
                "labkit.data", "labkit.data_parallel.wrap", "labkit.tensor_parallel.plan",
                "labkit.tensor_parallel.vocab_parallel", "labkit.tensor_parallel.sequence_parallel",
                "labkit.expert_parallel.metrics", "labkit.moe_stats")

# --------------------------------------------------------------------------------------------
def launch(fn, world_size: int, *args, backend: str = "auto", timeout: float = DEFAULT_TIMEOUT,
           collective_timeout: float = DEFAULT_COLLECTIVE_TIMEOUT, allow_tf32: bool = False,
           live_output: bool | None = None, on_message=print, rank_memory_bytes: float = 0.0,
           **kwargs) -> list:
    """Run ``fn(*args, **kwargs)`` on ``world_size`` ranks; return their results in rank order.

    ``timeout``: seconds for the whole launch. ``collective_timeout``: seconds one collective may
    wait. ``allow_tf32``: keep TF32 matmuls (off by default, for fp32 parity). ``live_output``:
    also print ranks' output live (default: env ``LABKIT_LIVE_OUTPUT=1``). ``on_message``: called
    with each object a rank passes to :func:`send_to_parent`. ``rank_memory_bytes``: host memory a
    CPU rank will need besides the process (``labkit.preflight``), checked with the world size.
    """
    positive_int("world_size", world_size)
    for name, value in (("timeout", timeout), ("collective_timeout", collective_timeout)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            raise ValueError(f"{name} must be a finite number of seconds > 0, got {value!r}")
    if under_torchrun():
        return _run_in_process(fn, world_size, args, kwargs, backend, collective_timeout, allow_tf32)
    backend = _auto_backend(world_size) if backend == "auto" else resolve_backend(backend, world_size)
    check_capacity(world_size, 0.0 if launch_rank.uses_cuda(backend) else rank_memory_bytes)
    if live_output is None:
        live_output = os.environ.get("LABKIT_LIVE_OUTPUT", "") not in ("", "0")

    store = dist.TCPStore("127.0.0.1", 0, world_size + 1, is_master=True, wait_for_workers=False,
                          timeout=datetime.timedelta(seconds=timeout))
    ctx = mp.get_context("forkserver")
    # torch._dynamo: every torch.optim optimizer imports it on construction (torch/_compile.py),
    # 1-2 s of CPU per rank; imported once in the forkserver, every forked rank has it for free.
    # RANK_MODULES likewise, for the ranks of labkit.train (and of most tests and labs)
    ctx.set_forkserver_preload(["torch", "torch.distributed", "torch._dynamo", "cloudpickle",
                                "labkit.launch_rank", *RANK_MODULES])
    results_q = ctx.Queue()
    payload = cloudpickle.dumps((fn, args, kwargs))
    # rank output: files without a name (nothing to clean up after a kill); ranks write through a
    # shared descriptor, the caller reads with pread (no shared offset moves)
    logs = [tempfile.TemporaryFile(prefix="labkit-rank") for _ in range(world_size)]
    alive, alive_w = ctx.Pipe(duplex=False)   # the caller holds the only write end: see watch_caller
    caller_env = dict(os.environ)
    procs = [ctx.Process(target=launch_rank.rank_main, daemon=True, args=(
        r, world_size, backend, store.port, timeout, collective_timeout, allow_tf32,
        launch_rank.rank_env(caller_env, r, world_size, store.port, allow_tf32),
        payload, results_q, launch_rank.InheritedFd(logs[r].fileno()), alive)) for r in range(world_size)]
    live = LiveOutput(logs) if live_output else None
    try:
        with _main_module_hidden():
            for p in procs:
                p.start()
        alive.close()
        return collect(procs, results_q, logs, timeout, on_message, live)
    finally:
        stop(procs)
        alive.close()
        alive_w.close()
        results_q.close()
        if live is not None:
            live.poll(final=True)
        for f in logs:
            f.close()
        del store


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


def _run_in_process(fn, world_size, args, kwargs, backend, collective_timeout, allow_tf32):
    """Under torchrun: this process is one rank; run fn here and all-gather the results."""
    env_world = int(os.environ["WORLD_SIZE"])
    if env_world != world_size:
        raise ValueError(f"launch(world_size={world_size}) under torchrun with WORLD_SIZE={env_world}")
    if not dist.is_initialized():
        local_rank = int(os.environ.get("LOCAL_RANK", 0))
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))  # ranks on this node
        if backend == "auto":                             # this process's one group: decided once
            backend = _auto or os.environ.get("LABKIT_BACKEND", "auto").strip() or "auto"
        backend = resolve_backend(backend, local_world)
        if not allow_tf32:
            os.environ["TORCH_ALLOW_TF32_CUBLAS_OVERRIDE"] = "0"
        launch_rank.start(backend, local_rank, allow_tf32)
        dist.init_process_group(backend, **generation_store(world_size), **launch_rank.process_group_kwargs(
            backend, local_rank, collective_timeout))
        atexit.register(_leave_together)  # a live group torn down at exit aborts the process
    try:
        out = to_cpu(fn(*args, **kwargs))
    except BaseException:
        # a failed rank leaves at once: the exit barrier would wait for ranks that wait for it
        atexit.unregister(_leave_together)
        raise
    gathered = [None] * world_size
    dist.all_gather_object(gathered, out)
    return gathered


def _leave_together() -> None:
    """At exit under torchrun: wait for every rank, then destroy the groups we opened."""
    if dist.is_initialized():
        dist.barrier()
        launch_rank.finish()

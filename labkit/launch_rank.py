"""The rank side of :mod:`labkit.launcher`: what a rank sets up before ``fn`` runs, and after.

Everything here runs inside one rank, spawned by ``launch`` or started by ``torchrun``:

* **Environment.** A spawned rank is forked from a forkserver started at the first launch; its
  inherited environment is the one of that moment. :func:`rank_env` builds the rank's environment
  from the caller's environment *at this launch* (so ``CUDA_VISIBLE_DEVICES``, ``NCCL_DEBUG`` and
  friends set later reach the ranks), plus the variables ``torchrun`` would set.
* **Device.** One place decides it (:func:`start`): ``cuda:LOCAL_RANK`` for a backend with NCCL in
  it (``"nccl"`` or ``"cpu:gloo,cuda:nccl"``), else the CPU. ``launcher.device()`` returns it.
* **Process group.** Under NCCL ``device_id`` is passed to ``init_process_group`` (the communicator
  is created at once, bound to this rank's GPU, instead of guessed at the first collective), and the
  group's ``timeout`` is the *collective* timeout (NCCL's watchdog), not the launch's wall clock.
  :func:`finish` destroys every group (``destroy_process_group()`` with no argument destroys the
  default group and all subgroups) before the rank reports success.
* **TF32 off.** The parity tests compare fp32 results to 1e-6; TF32 matmuls (10-bit mantissa) miss
  that by far. cuDNN allows TF32 by default, and NGC PyTorch containers set
  ``TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1``, which turns the matmul default on (PyTorch, "CUDA
  semantics", TensorFloat-32; MONAI docs/source/precision_accelerating.md). So every rank sets
  ``torch.backends.cuda.matmul.allow_tf32 = False`` and ``torch.backends.cudnn.allow_tf32 = False``
  explicitly, and sees the override variable as 0, unless the caller opts in
  (``launch(..., allow_tf32=True)``: faster fp32 matmuls, looser parity).
* **Results.** :func:`to_cpu` moves tensors to the CPU before they leave the rank, so the caller
  never receives CUDA tensors (which it could not mix with its own CPU tensors).
* **Nothing outlives the caller** (:func:`guard`, after ``rank_main``): a watchdog per rank, one in
  the forkserver, PR_SET_PDEATHSIG on Linux; output in unnamed files, no folder to leave behind.
"""
from __future__ import annotations

import copy
import dataclasses
import datetime
import os
import sys
import traceback

import cloudpickle
import torch
import torch.distributed as dist


class _RankState:
    """Per-process facts of the rank this process is (None outside any rank)."""
    channel = None   # (queue, rank) in a spawned rank: send_to_parent streams to the caller
    device = None    # torch.device decided by start()
    backend = None   # the backend string this rank's default group was created with
    collective_timeout = None   # timedelta of the default group, for subgroups (groups.subgroup_kwargs)


state = _RankState()


def uses_cuda(backend: str) -> bool:
    """True for "nccl" and mixed strings such as "cpu:gloo,cuda:nccl"."""
    return "nccl" in backend


def rank_env(caller_env, rank: int, world_size: int, port: int, allow_tf32: bool = False) -> dict:
    """The environment of spawned rank ``rank``: the caller's, now, plus torchrun's variables."""
    env = dict(caller_env)
    env.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world_size),
               LOCAL_WORLD_SIZE=str(world_size), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    env.setdefault("GLOO_SOCKET_IFNAME", "lo")   # ranks talk over loopback
    if not allow_tf32:
        env["TORCH_ALLOW_TF32_CUBLAS_OVERRIDE"] = "0"
    return env


def process_group_kwargs(backend: str, local_rank: int, collective_timeout: float) -> dict:
    """Keyword arguments of ``init_process_group`` besides backend/store/rank/world_size."""
    kw = {"timeout": datetime.timedelta(seconds=collective_timeout)}
    state.collective_timeout = kw["timeout"]          # subgroups get it too (labkit.groups)
    if uses_cuda(backend):
        kw["device_id"] = torch.device("cuda", local_rank)
    return kw


def set_tf32(allow: bool) -> None:
    """TF32 for fp32 matmuls (cuBLAS) and convolutions (cuDNN): off for parity, on if asked."""
    torch.backends.cuda.matmul.allow_tf32 = allow
    torch.backends.cudnn.allow_tf32 = allow


def start(backend: str, local_rank: int, allow_tf32: bool) -> torch.device:
    """Decide this rank's device (the one place), bind it, set TF32. Before init_process_group."""
    state.backend = backend
    state.device = torch.device("cuda", local_rank) if uses_cuda(backend) else torch.device("cpu")
    if state.device.type == "cuda":
        torch.cuda.set_device(state.device)
    set_tf32(allow_tf32)
    return state.device


def finish() -> None:
    """Destroy every process group (the default one and all subgroups) of this process."""
    if dist.is_initialized():
        dist.destroy_process_group()


def _move(obj):
    device = getattr(obj, "device", None)
    if isinstance(device, torch.device) and device.type != "cpu" and callable(getattr(obj, "cpu", None)):
        return obj.cpu()
    return obj


def to_cpu(obj, _memo=None):
    """``obj`` with every tensor on the CPU: through dicts, lists, tuples (named too) and dataclasses.

    A tensor (or anything with a non-CPU ``.device`` and a ``.cpu()``) is replaced by ``.cpu()``;
    CPU tensors are returned as they are (no copy). An ``nn.Module`` is moved in place. An object
    reached twice is moved once (sharing is kept). Other objects are returned unchanged.
    """
    memo = {} if _memo is None else _memo
    if id(obj) in memo:
        return memo[id(obj)]
    if isinstance(obj, torch.nn.Module):
        out = obj.cpu()
    elif isinstance(obj, dict):
        out = copy.copy(obj)                        # keeps the dict's type (OrderedDict, defaultdict)
        for k, v in obj.items():
            out[k] = to_cpu(v, memo)
    elif isinstance(obj, list):
        out = [to_cpu(v, memo) for v in obj]
        if type(obj) is not list:
            out = type(obj)(out)
    elif isinstance(obj, tuple):
        items = [to_cpu(v, memo) for v in obj]
        out = type(obj)(*items) if hasattr(obj, "_fields") else type(obj)(items)
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        out = copy.copy(obj)
        for f in dataclasses.fields(obj):
            object.__setattr__(out, f.name, to_cpu(getattr(obj, f.name), memo))  # frozen ones too
    else:
        out = _move(obj)
    memo[id(obj)] = out
    return out


def rank_main(rank, world_size, backend, port, launch_timeout, collective_timeout, allow_tf32,
              env, payload, results_q, log, alive):
    """Entry point of a spawned rank: capture output, set up, join the group, run, report."""
    guard(alive, log)                     # die with the caller; stdout/stderr to the caller's file
    sys.stdout.reconfigure(line_buffering=True)
    sys.stderr.reconfigure(line_buffering=True)
    os.environ.clear()                    # the forkserver's environment is the first launch's:
    os.environ.update(env)                # replace it with the caller's at this launch
    dist.set_debug_level_from_env()       # TORCH_DISTRIBUTED_DEBUG: read at import, in the forkserver
    torch.set_num_threads(1)              # N ranks share the cores; also makes CPU sums reproducible
    state.channel = (results_q, rank)
    try:
        start(backend, rank, allow_tf32)
        store = dist.TCPStore("127.0.0.1", port, world_size + 1, is_master=False,
                              timeout=datetime.timedelta(seconds=launch_timeout))
        dist.init_process_group(backend, store=store, rank=rank, world_size=world_size,
                                **process_group_kwargs(backend, rank, collective_timeout))
        dist.barrier()  # every rank has finished connecting before any rank may finish and leave
        fn, args, kwargs = cloudpickle.loads(payload)
        body = cloudpickle.dumps(to_cpu(fn(*args, **kwargs)))
        dist.barrier()  # nobody tears down its connections while a peer still uses them
        finish()        # a clean finish includes the teardown: a hang here is a timeout, not a leak
        results_q.put(("ok", rank, body))
    except BaseException:  # noqa: BLE001 - every failure must reach the caller
        tb = traceback.format_exc()
        print(tb, file=sys.stderr)
        results_q.put(("error", rank, tb))
    finally:
        results_q.close()
        results_q.join_thread()
        # after a failure the group is left as it is: the caller stops this process (an NCCL
        # teardown with a dead peer can block)


# -------------------------------------------------------------------------------------------
# Nothing outlives the caller. A rank's output goes to an unnamed temporary file the caller opened
# (``InheritedFd``: no folder to leave behind). Each rank watches a pipe whose only write end the
# caller holds (``watch_caller``): the caller's death, by any signal, closes it and the rank exits
# at once. The forkserver polls its parent (``_watch_forkserver_parent``, armed when it imports
# this module as its preload) and exits when the caller is gone, removing multiprocessing's
# pymp-* folder; on Linux every rank also asks the kernel for SIGKILL when the forkserver dies
# (PR_SET_PDEATHSIG), so a rank stuck in C code that holds the GIL goes too. On macOS (no
# PR_SET_PDEATHSIG) the pipe and the polling hold, but a rank stuck holding the GIL would outlive
# the caller. The resource tracker exits by itself once no process holds its pipe.
class InheritedFd:
    """A file descriptor of the caller, handed to a rank through the forkserver (as
    multiprocessing hands over a Connection: ``reduction.DupFd`` while the rank is started)."""

    def __init__(self, fd: int):
        self.fd = fd

    def __reduce__(self):
        from multiprocessing import reduction
        return _inherited, (reduction.DupFd(self.fd),)


def _inherited(dup) -> InheritedFd:
    return InheritedFd(dup.detach())


def guard(alive, log: InheritedFd) -> None:
    """First thing in a rank: watch the caller, ask for PR_SET_PDEATHSIG (Linux), send stdout and
    stderr to ``log``, and have faulthandler print the Python stack there on SIGSEGV/SIGBUS (and
    every thread's on SIGUSR1: the caller's hang report)."""
    import faulthandler
    import signal
    watch_caller(alive)
    _pdeathsig()
    os.dup2(log.fd, 1)
    os.dup2(log.fd, 2)
    os.close(log.fd)
    faulthandler.enable()
    if hasattr(signal, "SIGUSR1"):        # the caller's hang report asks for every thread's stack
        faulthandler.register(signal.SIGUSR1, all_threads=True)


def _pdeathsig() -> None:
    """Linux: SIGKILL this process when its parent (the forkserver) dies; elsewhere nothing."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes
    import signal
    parent = os.getppid()
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)   # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:   # the parent died before the request took effect
        os._exit(1)


def watch_caller(alive):
    """Exit this rank at once when the caller dies: ``alive`` is the read end of a pipe whose only
    write end the caller holds, so it reads EOF when the caller is gone (any signal, SIGKILL
    included) or has finished with the ranks."""
    import threading

    def watch():
        try:
            alive.poll(None)          # returns on EOF; the caller never writes
        except (OSError, EOFError):
            pass
        os._exit(1)
    thread = threading.Thread(target=watch, name="labkit-caller-watchdog", daemon=True)
    thread.start()
    return thread


def _watch_forkserver_parent(poll: float = 0.2) -> None:
    """In the forkserver: exit when the caller that started it is gone (its parent changes). Its
    ranks then follow (their pipe; on Linux also PR_SET_PDEATHSIG). multiprocessing's own test
    (EOF on its "alive" pipe) fails here: every forked rank holds a copy of that pipe's write end."""
    import atexit
    import threading
    import time
    caller = os.getppid()
    # the forkserver also ends by itself once its last rank is gone (EOF on its "alive" pipe, a
    # SystemExit): after a killed caller that can come before the watchdog's next poll
    atexit.register(lambda: os.getppid() != caller and _remove_listener())

    def watch():
        while os.getppid() == caller:
            time.sleep(poll)
        _remove_listener()
        os._exit(1)
    threading.Thread(target=watch, name="labkit-forkserver-watchdog", daemon=True).start()


def _remove_listener() -> None:
    """The forkserver's socket file and multiprocessing's pymp-* folder around it, which the dead
    caller's exit handler would have removed (Python < 3.12 on Linux, macOS: a path, not an
    abstract socket)."""
    from multiprocessing import forkserver
    address = getattr(forkserver._forkserver, "_forkserver_address", None)
    if isinstance(address, str) and address and not address.startswith("\0"):
        folder = os.path.dirname(address)
        for remove, path in ((os.unlink, address), (os.rmdir, folder)):   # the folder only if empty
            try:
                if remove is os.unlink or os.path.basename(folder).startswith("pymp-"):
                    remove(path)
            except OSError:
                pass


def _imported_by_forkserver() -> bool:
    """True while multiprocessing's forkserver imports its preload modules (this one among them)."""
    from multiprocessing import forkserver
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code is forkserver.main.__code__:
            return True
        frame = frame.f_back
    return False


if _imported_by_forkserver():
    _watch_forkserver_parent()

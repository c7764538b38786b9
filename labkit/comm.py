"""Every collective and point-to-point operation of the course, counted (chapter "Collectives").

All-reduce, all-gather, reduce-scatter, all-to-all, broadcast, and p2p whose shapes may vary. Every
function takes the :class:`~labkit.groups.Group` first and never changes its input in place. The
autograd-aware pairs built on them live beside the strategy that uses them
(``tensor_parallel/tp_comm.py``: Megatron's f/g and the sequence-parallel pairs;
``expert_parallel/ep_comm.py``: the all-to-all).

Bytes are counted on ``group.stats`` per op as one rank sends them under the textbook algorithm
(ring all-reduce 2(n-1)/n*N; all-gather, reduce-scatter, all-to-all (n-1)/n*N; N = full tensor).
gloo has no ReduceOp.AVG on older PyTorch, so averages are a SUM followed by a division.

Every call that communicates is also logged on ``group.log`` (:class:`~labkit.groups.CallLog`, a
ring buffer that stays on): when it entered and when it returned on this rank. Across ranks, who
entered last (and waited least) is a straggler (``labkit.debug.stragglers``).
"""
from __future__ import annotations

from time import perf_counter

import torch
import torch.distributed as dist

from .groups import Group

SEQ_DIM = 1  # activations are [b, s, h]: the sequence is dim 1


def _nbytes(x: torch.Tensor) -> int:
    return x.numel() * x.element_size()


def _logged(group: Group, op: str, t_enter: float, nbytes: float = 0, peers=None) -> None:
    """Log a call that entered at ``t_enter`` on the group's ring buffer (if it keeps one)."""
    log = getattr(group, "log", None)
    if log is not None:
        log.add(op, t_enter, nbytes, peers)


# ----------------------------------------------------------------------------------------------
# Counted, out-of-place collectives
# ----------------------------------------------------------------------------------------------
def all_reduce(group: Group, x: torch.Tensor, op: str = "sum") -> torch.Tensor:
    """Every rank gets the sum (or mean) of all ranks' ``x``."""
    if op not in ("sum", "mean"):
        raise ValueError(f"op must be 'sum' or 'mean', got {op!r}")
    y = x.clone()
    n = group.size
    if n > 1:
        t = perf_counter()
        dist.all_reduce(y, group=group.pg)
        _logged(group, "all_reduce", t, _nbytes(x))
        group.stats.add("all_reduce", 2 * (n - 1) / n * _nbytes(x))
    return y / n if op == "mean" else y


def all_gather(group: Group, x: torch.Tensor, dim: int = 0) -> torch.Tensor:
    """Concatenate every rank's ``x`` along ``dim`` (rank order)."""
    n = group.size
    if n == 1:
        return x.clone()
    x = x.contiguous()
    parts = [torch.empty_like(x) for _ in range(n)]
    t = perf_counter()
    dist.all_gather(parts, x, group=group.pg)
    _logged(group, "all_gather", t, n * _nbytes(x))
    group.stats.add("all_gather", (n - 1) * _nbytes(x))  # = (n-1)/n * N, N = gathered size
    return torch.cat(parts, dim=dim)


def reduce_scatter(group: Group, x: torch.Tensor, dim: int = 0) -> torch.Tensor:
    """Sum ``x`` over ranks and keep this rank's chunk along ``dim``."""
    n = group.size
    if n == 1:
        return x.clone()
    if x.shape[dim] % n:
        raise ValueError(f"reduce_scatter: size {x.shape[dim]} of dim {dim} not divisible by {n}")
    chunks = [c.contiguous() for c in x.chunk(n, dim=dim)]
    out = torch.empty_like(chunks[0])
    t = perf_counter()
    dist.reduce_scatter(out, chunks, group=group.pg)
    _logged(group, "reduce_scatter", t, _nbytes(out))
    group.stats.add("reduce_scatter", (n - 1) / n * _nbytes(x))
    return out


def all_to_all(group: Group, x: torch.Tensor, output_split_sizes=None, input_split_sizes=None):
    """Rank r sends chunk j of ``x`` (dim 0) to rank j and receives everyone's chunk r.

    Equal chunks unless split sizes (rows per peer) are given, as expert dispatch needs.
    """
    n = group.size
    if n == 1:
        return x.clone()
    ins = list(x.contiguous().split(input_split_sizes or x.shape[0] // n))
    if len(ins) != n:
        raise ValueError(f"all_to_all: {x.shape[0]} rows do not split into {n} equal chunks")
    outs_rows = list(output_split_sizes or [ins[0].shape[0]] * n)
    out = x.new_empty((sum(outs_rows), *x.shape[1:]))
    # the single-tensor form: gloo's list form needs equal chunks, expert dispatch has uneven ones
    t0 = perf_counter()
    dist.all_to_all_single(out, x.contiguous(), outs_rows, [c.shape[0] for c in ins], group=group.pg)
    _logged(group, "all_to_all", t0, _nbytes(out))        # what arrived: an expert's load
    group.stats.add("all_to_all", sum(_nbytes(t) for j, t in enumerate(ins) if j != group.rank))
    return out


def broadcast(group: Group, x: torch.Tensor, src: int = 0) -> torch.Tensor:
    """Every rank gets group rank ``src``'s ``x`` (others pass a tensor of the same shape)."""
    n = group.size
    y = x.clone()
    if n > 1:
        t = perf_counter()
        dist.broadcast(y, src=group.global_rank(src), group=group.pg)
        _logged(group, "broadcast", t, _nbytes(x))
        # pipelined chain src -> src+1 -> ...: every rank but the last in the chain forwards N
        if (group.rank - src) % n != n - 1:
            group.stats.add("broadcast", _nbytes(x))
    return y


# ----------------------------------------------------------------------------------------------
# Point-to-point (pipeline stages, rings). NCCL matches a pair's messages in order and ignores tags,
# so labkit never uses tags (gloo then matches in order too, and CI sees NCCL's semantics) and always
# batches (batch_isend_irecv: NCCL then uses the group's own communicator, which build_groups made).
# send/recv carry a small header first (dtype, shape), so a lab may send any shape; the pipeline's
# exchange knows its shapes and sends, beside each tensor, three integers naming the message, so a
# message arriving out of order is an error, not silently wrong data.
# ----------------------------------------------------------------------------------------------
_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32,
           torch.bool, torch.uint8]
_MAX_DIMS = 6   # header: [dtype, ndim, shape x 6] int64


def _device(device=None) -> torch.device:
    if device is not None:
        return torch.device(device)
    from .launcher import device as rank_device
    return rank_device()


def _batch(group: Group, ops) -> None:
    """Post ``ops`` [(isend|irecv, tensor, group rank)] together, wait for all of them."""
    if ops:
        t0 = perf_counter()
        reqs = dist.batch_isend_irecv([dist.P2POp(op, t, group.global_rank(peer), group.pg)
                                       for op, t, peer in ops])
        for req in reqs:
            req.wait()
        # peers: (global ranks sent to, global ranks received from), one per message
        _logged(group, "p2p", t0, sum(_nbytes(x) for op, x, _ in ops if op is dist.isend),
                (tuple(group.global_rank(p) for op, _, p in ops if op is dist.isend),
                 tuple(group.global_rank(p) for op, _, p in ops if op is not dist.isend)))


def send(group: Group, x: torch.Tensor, dst: int) -> None:
    """Send ``x`` to group rank ``dst``, header (dtype, shape) first: the receiver needs no shape."""
    x = x.detach().contiguous()
    if x.dim() > _MAX_DIMS:
        raise ValueError(f"send: at most {_MAX_DIMS} dims, got {x.dim()}")
    header = torch.tensor([_DTYPES.index(x.dtype), x.dim(), *x.shape, *[0] * (_MAX_DIMS - x.dim())],
                          dtype=torch.int64, device=x.device)
    _batch(group, [(dist.isend, header, dst), (dist.isend, x, dst)])
    group.stats.add("send", _nbytes(x))
    group.stats.add("p2p_header", _nbytes(header))


def recv(group: Group, src: int, device=None) -> torch.Tensor:
    """Receive a tensor sent by :func:`send` from group rank ``src`` (on this rank's device)."""
    header = torch.empty(2 + _MAX_DIMS, dtype=torch.int64, device=_device(device))
    _batch(group, [(dist.irecv, header, src)])
    h = header.tolist()                                     # one host sync for the whole header
    out = torch.empty(h[2:2 + h[1]], dtype=_DTYPES[h[0]], device=header.device)
    _batch(group, [(dist.irecv, out, src)])
    return out


def send_recv(group: Group, x: torch.Tensor, dst: int, src: int) -> torch.Tensor:
    """Send ``x`` to ``dst`` and receive a tensor of the same shape from ``src``, in one batch: the
    step of a ring (ring all-reduce, ring attention) that cannot deadlock."""
    out = torch.empty_like(x)
    _batch(group, [(dist.isend, x.contiguous(), dst), (dist.irecv, out, src)])
    group.stats.add("send", _nbytes(x))
    return out


def exchange(group: Group, sends=(), recvs=(), device=None) -> list[torch.Tensor]:
    """One batched step of named messages, all posted at once (one NCCL group).

    ``sends`` [(tensor, dst, name)], ``recvs`` [(src, name, shape, dtype)]; a name is 3 integers.
    Each tensor travels with its name; returns the received tensors in ``recvs`` order. Raises
    RuntimeError if a message carries another name than the receiver expects.
    """
    dev = _device(device)
    sends = [(x.detach().contiguous(), dst, name) for x, dst, name in sends]
    names = [torch.empty(3, dtype=torch.int64, device=dev) for _ in recvs]
    outs = [torch.empty(tuple(shape), dtype=dtype, device=dev) for _, _, shape, dtype in recvs]
    ops = []
    for x, dst, name in sends:
        ops += [(dist.isend, torch.tensor(name, dtype=torch.int64, device=dev), dst), (dist.isend, x, dst)]
    for got, out, (src, *_) in zip(names, outs, recvs):
        ops += [(dist.irecv, got, src), (dist.irecv, out, src)]
    _batch(group, ops)
    for got, (src, name, *_) in zip(names, recvs):
        if tuple(got.tolist()) != tuple(name):
            raise RuntimeError(f"p2p order mismatch: from group rank {src} expected message "
                               f"{tuple(name)}, got {tuple(got.tolist())}")
    for x, _, _ in sends:
        group.stats.add("send", _nbytes(x))
        group.stats.add("p2p_header", 3 * 8)
    return outs

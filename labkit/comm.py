"""Every collective of the course, counted, and the autograd-aware conjugate pairs built on them.

Chapter "Collectives" (all-reduce, all-gather, reduce-scatter, all-to-all, broadcast, p2p) and
chapter "Tensor parallelism" (the f/g operators of Shoeybi et al. 2019, Megatron's mappings.py).
Every function takes the :class:`~labkit.groups.Group` first and never changes its input in place.

Autograd pairs: the backward of each is the conjugate (transpose) of its forward.

| name                        | forward                 | backward                | dim        |
|-----------------------------|-------------------------|-------------------------|------------|
| copy_to (Megatron's f)      | identity                | all-reduce              | -          |
| reduce_from (Megatron's g)  | all-reduce              | identity                | -          |
| scatter_to                  | keep my chunk           | all-gather              | any (-1)   |
| gather_from                 | all-gather              | keep my chunk           | any (-1)   |
| scatter_to_sequence         | keep my chunk           | all-gather              | seq (1)    |
| gather_from_sequence        | all-gather              | reduce-scatter          | seq (1)    |
| reduce_scatter_to_sequence  | reduce-scatter          | all-gather              | seq (1)    |
| all_to_all                  | all-to-all (splits)     | all-to-all (splits swapped) | 0      |

Bytes are counted on ``group.stats`` per op as one rank sends them under the textbook algorithm
(ring all-reduce 2(n-1)/n*N; all-gather, reduce-scatter, all-to-all (n-1)/n*N; N = full tensor).
gloo has no ReduceOp.AVG on older PyTorch, so averages are a SUM followed by a division.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from .groups import Group

SEQ_DIM = 1  # activations are [b, s, h]: the sequence is dim 1


def _nbytes(x: torch.Tensor) -> int:
    return x.numel() * x.element_size()


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
        dist.all_reduce(y, group=group.pg)
        group.stats.add("all_reduce", 2 * (n - 1) / n * _nbytes(x))
    return y / n if op == "mean" else y


def all_gather(group: Group, x: torch.Tensor, dim: int = 0) -> torch.Tensor:
    """Concatenate every rank's ``x`` along ``dim`` (rank order)."""
    n = group.size
    if n == 1:
        return x.clone()
    x = x.contiguous()
    parts = [torch.empty_like(x) for _ in range(n)]
    dist.all_gather(parts, x, group=group.pg)
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
    dist.reduce_scatter(out, chunks, group=group.pg)
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
    outs_rows = output_split_sizes or [ins[0].shape[0]] * n
    outs = [x.new_empty((rows, *x.shape[1:])) for rows in outs_rows]
    dist.all_to_all(outs, [t.contiguous() for t in ins], group=group.pg)
    group.stats.add("all_to_all", sum(_nbytes(t) for j, t in enumerate(ins) if j != group.rank))
    return torch.cat(outs, dim=0)


def broadcast(group: Group, x: torch.Tensor, src: int = 0) -> torch.Tensor:
    """Every rank gets group rank ``src``'s ``x`` (others pass a tensor of the same shape)."""
    n = group.size
    y = x.clone()
    if n > 1:
        dist.broadcast(y, src=group.global_rank(src), group=group.pg)
        # pipelined chain src -> src+1 -> ...: every rank but the last in the chain forwards N
        if (group.rank - src) % n != n - 1:
            group.stats.add("broadcast", _nbytes(x))
    return y


# ----------------------------------------------------------------------------------------------
# Point-to-point (pipeline stages, ring attention); shapes may vary from call to call
# ----------------------------------------------------------------------------------------------
_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32,
           torch.bool, torch.uint8]
_MAX_DIMS = 6


def send(group: Group, x: torch.Tensor, dst: int, tag: int = 0, wait: bool = True):
    """Send ``x`` to group rank ``dst``, shape and dtype first, so the receiver needs no shape.

    Uses tags ``tag`` (header) and ``tag + 1`` (data); gloo matches them, NCCL ignores tags.
    ``wait=False`` only posts the sends (a pipeline stage must not block while its neighbour
    sends to it too) and returns [(request, tensor)]: keep them, and ``request.wait()`` each.
    """
    x = x.detach().contiguous()
    if x.dim() > _MAX_DIMS:
        raise ValueError(f"send: at most {_MAX_DIMS} dims, got {x.dim()}")
    header = torch.zeros(2 + _MAX_DIMS, dtype=torch.int64, device=x.device)
    header[0], header[1] = _DTYPES.index(x.dtype), x.dim()
    header[2:2 + x.dim()] = torch.tensor(x.shape, dtype=torch.int64)
    peer = group.global_rank(dst)
    reqs = [dist.isend(header, peer, group=group.pg, tag=tag),
            dist.isend(x, peer, group=group.pg, tag=tag + 1)]
    group.stats.add("send", _nbytes(x))
    group.stats.add("p2p_header", _nbytes(header))
    if not wait:
        return list(zip(reqs, (header, x)))  # the tensors must live until the sends complete
    for req in reqs:
        req.wait()
    return None


def recv(group: Group, src: int, device=None, tag: int = 0) -> torch.Tensor:
    """Receive a tensor sent by :func:`send` (with the same ``tag``) from group rank ``src``."""
    header = torch.zeros(2 + _MAX_DIMS, dtype=torch.int64, device=device)
    peer = group.global_rank(src)
    dist.recv(header, peer, group=group.pg, tag=tag)
    dtype, ndim = _DTYPES[int(header[0])], int(header[1])
    out = torch.empty(tuple(header[2:2 + ndim].tolist()), dtype=dtype, device=device)
    dist.recv(out, peer, group=group.pg, tag=tag + 1)
    return out


def send_recv(group: Group, x: torch.Tensor, dst: int, src: int) -> torch.Tensor:
    """Send ``x`` to ``dst`` and receive a tensor of the same shape from ``src``, without deadlock.

    The ring step of ring attention and ring all-reduce: both transfers are posted at once.
    """
    out = torch.empty_like(x)
    ops = [dist.P2POp(dist.isend, x.contiguous(), group.global_rank(dst), group.pg),
           dist.P2POp(dist.irecv, out, group.global_rank(src), group.pg)]
    for req in dist.batch_isend_irecv(ops):
        req.wait()
    group.stats.add("send", _nbytes(x))
    return out


# ----------------------------------------------------------------------------------------------
# Autograd conjugate pairs (Megatron-LM megatron/core/tensor_parallel/mappings.py)
# ----------------------------------------------------------------------------------------------
def _chunk(group: Group, x: torch.Tensor, dim: int) -> torch.Tensor:
    if x.shape[dim] % group.size:
        raise ValueError(f"size {x.shape[dim]} of dim {dim} not divisible by group size {group.size}")
    return x.chunk(group.size, dim=dim)[group.rank].contiguous()


class _CopyTo(torch.autograd.Function):
    """f: forward identity, backward all-reduce (the input was used by every rank)."""
    @staticmethod
    def forward(ctx, group, x):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return None, all_reduce(ctx.group, g)


class _ReduceFrom(torch.autograd.Function):
    """g: forward all-reduce of partial sums, backward identity (the gradient is replicated)."""
    @staticmethod
    def forward(ctx, group, x):
        return all_reduce(group, x)

    @staticmethod
    def backward(ctx, g):
        return None, g


class _ScatterTo(torch.autograd.Function):
    """Forward: keep my chunk along dim; backward: all-gather along dim."""
    @staticmethod
    def forward(ctx, group, x, dim):
        ctx.group, ctx.dim = group, dim
        return _chunk(group, x, dim)

    @staticmethod
    def backward(ctx, g):
        return None, all_gather(ctx.group, g, ctx.dim), None


class _GatherFrom(torch.autograd.Function):
    """Forward: all-gather along dim; backward: keep my chunk."""
    @staticmethod
    def forward(ctx, group, x, dim):
        ctx.group, ctx.dim = group, dim
        return all_gather(group, x, dim)

    @staticmethod
    def backward(ctx, g):
        return None, _chunk(ctx.group, g, ctx.dim), None


class _GatherFromSequence(torch.autograd.Function):
    """SP entering the TP region: forward all-gather, backward reduce-scatter (sums partial grads)."""
    @staticmethod
    def forward(ctx, group, x, dim):
        ctx.group, ctx.dim = group, dim
        return all_gather(group, x, dim)

    @staticmethod
    def backward(ctx, g):
        return None, reduce_scatter(ctx.group, g, ctx.dim), None


class _ReduceScatterToSequence(torch.autograd.Function):
    """SP leaving the TP region: forward reduce-scatter, backward all-gather."""
    @staticmethod
    def forward(ctx, group, x, dim):
        ctx.group, ctx.dim = group, dim
        return reduce_scatter(group, x, dim)

    @staticmethod
    def backward(ctx, g):
        return None, all_gather(ctx.group, g, ctx.dim), None


class _AllToAll(torch.autograd.Function):
    """Forward all-to-all with (out, in) splits; backward the same exchange with splits swapped."""
    @staticmethod
    def forward(ctx, group, x, output_split_sizes, input_split_sizes):
        ctx.group, ctx.splits = group, (output_split_sizes, input_split_sizes)
        return all_to_all(group, x, output_split_sizes, input_split_sizes)

    @staticmethod
    def backward(ctx, g):
        out_s, in_s = ctx.splits
        return None, all_to_all(ctx.group, g.contiguous(), in_s, out_s), None, None


def copy_to(group: Group, x):
    return _CopyTo.apply(group, x) if group.size > 1 else x


def reduce_from(group: Group, x):
    return _ReduceFrom.apply(group, x) if group.size > 1 else x


def scatter_to(group: Group, x, dim: int = -1):
    return _ScatterTo.apply(group, x, dim) if group.size > 1 else x


def gather_from(group: Group, x, dim: int = -1):
    return _GatherFrom.apply(group, x, dim) if group.size > 1 else x


def scatter_to_sequence(group: Group, x, dim: int = SEQ_DIM):
    return _ScatterTo.apply(group, x, dim) if group.size > 1 else x


def gather_from_sequence(group: Group, x, dim: int = SEQ_DIM):
    return _GatherFromSequence.apply(group, x, dim) if group.size > 1 else x


def reduce_scatter_to_sequence(group: Group, x, dim: int = SEQ_DIM):
    return _ReduceScatterToSequence.apply(group, x, dim) if group.size > 1 else x


def all_to_all_autograd(group: Group, x, output_split_sizes=None, input_split_sizes=None):
    if group.size == 1:
        return x
    return _AllToAll.apply(group, x, output_split_sizes, input_split_sizes)

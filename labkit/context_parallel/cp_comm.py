"""The communication of context parallelism: the ring's batched step, and Ulysses' all-to-all pair.

Chapter "Context parallelism". Every op is counted on the group's stats (``labkit.comm``), so the
bytes a lab measures are compared with ``labkit.calc.comm.cp_attention_bytes``.

| function            | forward                                      | backward              | dims          |
|---------------------|----------------------------------------------|-----------------------|---------------|
| ring_exchange       | send to rank r+1, receive from r-1 (posted,  | - (the backward ring  | any           |
|                     | not waited: compute runs while it travels)   |   calls it again)     |               |
| seq_to_head   (a2a) | all-to-all: [.., n, s/c, d] -> [.., n/c, s, d] | head_to_seq         | heads, seq    |
| head_to_seq   (a2a) | all-to-all: [.., n/c, s, d] -> [.., n, s/c, d] | seq_to_head         | heads, seq    |

The ring step posts all its sends and receives as ONE ``batch_isend_irecv`` before the block's
computation and waits after it: the transfer overlaps the compute, and on NCCL a batched pair
cannot deadlock (an unbatched "send, then receive" around a ring can: every rank would wait in
its send). Each rank posts the same pattern in the same order, so gloo and NCCL, which match
point-to-point messages by order (labkit uses no tags), pair them correctly. The all-to-all's
sequence axis comes out rank-major (rank 0's tokens, then rank 1's, ...), the order the caller
undoes with ``sharding``.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from .. import comm
from ..groups import Group


class Pending:
    """Posted ring transfers; :meth:`wait` returns the received tensors (in the order sent)."""

    def __init__(self, reqs, received):
        self.reqs, self.received = reqs, received

    def wait(self) -> list:
        for req in self.reqs:
            req.wait()
        return self.received


def ring_exchange(group: Group, tensors) -> Pending:
    """Post: send each of ``tensors`` to group rank r+1, receive as many tensors of the same
    shapes from rank r-1. Counted as one "send_recv" with the bytes sent."""
    n, r = group.size, group.rank
    tensors = [t.contiguous() for t in tensors]
    received = [torch.empty_like(t) for t in tensors]
    nxt, prv = group.global_rank((r + 1) % n), group.global_rank((r - 1) % n)
    ops = [dist.P2POp(dist.isend, t, nxt, group.pg) for t in tensors]
    ops += [dist.P2POp(dist.irecv, t, prv, group.pg) for t in received]
    reqs = dist.batch_isend_irecv(ops)
    group.stats.add("send_recv", sum(t.numel() * t.element_size() for t in tensors))
    return Pending(reqs, received)


def _seq_to_head(group: Group, x):
    """[.., n, s_l, d] (my tokens, all heads) -> [.., n/c, c*s_l, d] (everyone's tokens, my heads)."""
    c = group.size
    *lead, n, s_l, d = x.shape
    parts = x.reshape(*lead, c, n // c, s_l, d).movedim(-4, 0).contiguous()  # [c, .., n/c, s_l, d]
    got = comm.all_to_all(group, parts)                    # row j came from rank j: its tokens
    return got.movedim(0, -3).reshape(*lead, n // c, c * s_l, d)


def _head_to_seq(group: Group, x):
    """The inverse: [.., n/c, c*s_l, d] -> [.., n, s_l, d]."""
    c = group.size
    *lead, nc, s, d = x.shape
    parts = x.reshape(*lead, nc, c, s // c, d).movedim(-3, 0).contiguous()   # [c, .., n/c, s_l, d]
    got = comm.all_to_all(group, parts)                    # row j: head group j, my tokens
    return got.movedim(0, -4).reshape(*lead, c * nc, s // c, d)


class _SeqToHead(torch.autograd.Function):
    """Forward seq -> head all-to-all; backward the inverse all-to-all of the gradient."""
    @staticmethod
    def forward(ctx, group, x):
        ctx.group = group
        return _seq_to_head(group, x)

    @staticmethod
    def backward(ctx, g):
        return None, _head_to_seq(ctx.group, g)


class _HeadToSeq(torch.autograd.Function):
    """Forward head -> seq all-to-all; backward the inverse all-to-all of the gradient."""
    @staticmethod
    def forward(ctx, group, x):
        ctx.group = group
        return _head_to_seq(group, x)

    @staticmethod
    def backward(ctx, g):
        return None, _seq_to_head(ctx.group, g)


def seq_to_head(group: Group, x):
    """Ulysses' first all-to-all (autograd-aware): sequence-sharded -> head-sharded."""
    if x.shape[-3] % group.size:
        raise ValueError(f"all-to-all over {group.size} ranks needs heads divisible by it, got {x.shape[-3]}")
    return x if group.size == 1 else _SeqToHead.apply(group, x)


def head_to_seq(group: Group, x):
    """Ulysses' second all-to-all (autograd-aware): head-sharded -> sequence-sharded."""
    return x if group.size == 1 else _HeadToSeq.apply(group, x)

"""All-gather context parallelism (``cp_comm_type="all_gather"``): every rank gathers all K and V.

Chapter "Context parallelism" (Llama 3's context parallelism, Dubey et al. 2024, Sec. 3.3.2;
Megatron-LM / Transformer Engine's ``AttnFuncWithCPAndKVAllGather``). Forward: one all-gather of
the stacked K/V [2, b, n, s/c, d] -> [2, b, n, s, d] (rank-major), then this rank's queries attend
over every block (``blockwise.attend``, the same causal chunk rule as the ring). Backward: gather
K/V again (they were not kept: only this rank's q, k, v, out, lse are), compute the queries'
gradient and their share of every block's dK/dV, and reduce-scatter the full dK/dV so that each
rank receives the sum for its own block.

Same bytes as the ring (an all-gather moves (c-1)/c of the gathered tensor, the ring c-1 blocks),
but not overlapped with compute, and the gathered [2, b, n, s, d] is held during the layer's
attention. Llama 3 chose it because with GQA K/V are small and an all-gather is easy to make
work with uneven document masks; Megatron exposes it next to p2p and a2a.
"""
from __future__ import annotations

import torch

from .. import comm
from ..groups import Group
from .blockwise import Work, attend, attend_backward, finish
from .sharding import chunk_ids

SEQ = 3  # the stacked K/V are [2, b, n, s, d]: the sequence is dim 3


class _AllGatherAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, group, q, k, v, layout, causal, work):
        c, r = group.size, group.rank
        ids = [chunk_ids(j, c, layout) for j in range(c)]
        kv = comm.all_gather(group, torch.stack([k, v]), dim=SEQ)      # [2, b, n, s, d]
        acc = None
        for src, (ks, vs) in enumerate(kv.chunk(c, dim=SEQ)):           # block of rank src
            acc = attend(q, ks, vs, ids[r], ids[src], acc, causal, work)
        out, lse = finish(acc, q)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.group, ctx.ids, ctx.causal, ctx.work = group, ids, causal, work
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        group, ids = ctx.group, ctx.ids
        c, r = group.size, group.rank
        dout = dout.contiguous()
        delta = (dout * out).sum(dim=-1)
        kv = comm.all_gather(group, torch.stack([k, v]), dim=SEQ)      # gathered again
        dq, dkv = torch.zeros_like(q), []
        for src, (ks, vs) in enumerate(kv.chunk(c, dim=SEQ)):
            gq, gk, gv = attend_backward(q, ks, vs, out, lse, dout, delta, ids[r], ids[src],
                                         ctx.causal, ctx.work)
            dq += gq
            dkv.append(torch.stack([gk, gv]))                           # my queries' share of block src
        dk, dv = comm.reduce_scatter(group, torch.cat(dkv, dim=SEQ), dim=SEQ)   # sum, keep my block
        return None, dq, dk, dv, None, None, None


def allgather_attention(group: Group, q, k, v, layout: str = "balanced", causal: bool = True,
                        work: Work | None = None):
    """q, k, v [b, n, s/c, d] (this rank's tokens, ``sharding`` order) -> [b, n, s/c, d]."""
    return _AllGatherAttention.apply(group, q, k, v, layout, causal, work)

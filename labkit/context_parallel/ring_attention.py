"""Ring attention (``cp_comm_type="p2p"``, Megatron's default): K/V blocks travel round the CP ring.

Chapter "Context parallelism" (Liu et al. 2023, Ring Attention; Megatron-LM / Transformer Engine's
``AttnFuncWithCPAndKVP2P``). Rank r of c holds the queries, keys and values of its 2 chunks
(``sharding``). Forward, c steps: at step i it holds the K/V block of rank (r - i) mod c; it posts
the exchange of that block to rank r+1 (and the receipt of the next from r-1) BEFORE computing on
it, so the transfer runs under the computation; the partial results merge online (``merge.py``).

The backward is a second ring, written by hand (not autograd through the forward): at step i the
rank again holds K/V of rank (r - i) and computes, with the final output and lse, the gradient of
its queries (kept) and its queries' share of that block's dK, dV. The dK/dV accumulator of a
block travels one hop behind it: rank r sends what it summed for block (r - i) to rank r+1, which
holds that block at step i+1 and adds its share; after the last step each accumulator arrives at
the block's owner. Per rank and layer: forward c-1 K/V sends; backward c-1 K/V sends and c-1
dK/dV sends (``labkit.calc.comm.cp_attention_bytes``). Each rank keeps only its own q, k, v, out
and lse for the backward (no other rank's K/V, no s x s scores), as Megatron does.
"""
from __future__ import annotations

import torch

from ..groups import Group
from .blockwise import Work, attend, attend_backward, finish
from .cp_comm import ring_exchange
from .sharding import chunk_ids


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, group, q, k, v, layout, causal, work):
        c, r = group.size, group.rank
        ids = [chunk_ids(j, c, layout) for j in range(c)]
        acc, kv = None, (k, v)
        for step in range(c):
            pending = ring_exchange(group, kv) if step < c - 1 else None   # next block, in flight
            acc = attend(q, *kv, ids[r], ids[(r - step) % c], acc, causal, work)
            if pending is not None:
                kv = tuple(pending.wait())
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
        delta = (dout * out).sum(dim=-1)                    # [b, n, sq], once for all blocks
        dq, kv, acc, dkv_own = torch.zeros_like(q), (k, v), None, None
        for step in range(c):
            sends = list(kv) if step < c - 1 else []        # K/V for the next step
            if step >= 2:                                   # the dK/dV summed one step ago
                sends += list(acc)
            pending = ring_exchange(group, sends) if sends else None
            gq, gk, gv = attend_backward(q, *kv, out, lse, dout, delta, ids[r], ids[(r - step) % c],
                                         ctx.causal, ctx.work)
            dq += gq
            got = pending.wait() if pending is not None else []
            if step == 0:
                dkv_own = (gk, gv)                          # my block, my queries
            elif step == 1:
                acc = (gk, gv)                              # block r-1: the first share of it
            else:                                           # add the shares ranks r-step+1.. summed
                acc = (got[-2] + gk, got[-1] + gv)
            if step < c - 1:
                kv = tuple(got[:2])
        if c > 1:                                           # last hop: accumulators reach owners
            dk_in, dv_in = ring_exchange(group, acc).wait()
            dk, dv = dkv_own[0] + dk_in, dkv_own[1] + dv_in
        else:
            dk, dv = dkv_own
        return None, dq, dk, dv, None, None, None


def ring_attention(group: Group, q, k, v, layout: str = "balanced", causal: bool = True,
                   work: Work | None = None):
    """Attention of this rank's queries over the whole sequence, K/V passed round the ring.

    q, k, v: [b, n, s/c, d], this rank's tokens in ``sharding`` order (``layout``); returns
    [b, n, s/c, d]. ``work``: a ``blockwise.Work`` that adds up what this rank computed.
    """
    return _RingAttention.apply(group, q, k, v, layout, causal, work)

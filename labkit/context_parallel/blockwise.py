"""One rank's query chunks against one K/V block of chunks: the local step every CP variant repeats.

Chapter "Context parallelism". A rank holds 2 chunks of queries (``sharding.chunk_ids``); a K/V
block (its own, or one received from another rank) holds 2 chunks of keys. For each (query chunk,
key chunk) pair ``sharding.pair_kind`` says "full", "diag" (causal inside) or skip; the visible
pairs are computed with ``merge.block_attention`` and merged into that query chunk's running
result. Skipped pairs cost nothing: that is where the causal imbalance of a contiguous split
shows, and where the load-balanced split evens it out (:class:`Work` counts what was computed).

    acc = None
    for each K/V block:  acc = attend(q, k, v, my_ids, block_ids, acc)
    out, lse = finish(acc)
    ... backward: dq, dk, dv of each block = attend_backward(q, k, v, out, lse, dout, delta, ...)

Group-query attention: q has n heads, k and v g (query head i reads K/V head i // (n/g)). The K/V
blocks travel with their g heads (that is what makes K/V small under GQA); each block is widened
to n heads only for the local computation, and its dK, dV are summed back over the n/g query heads
that read each K/V head.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from .merge import NEG_INF, block_attention, block_attention_backward, causal_mask, merge_partials
from .sharding import pair_kind


@dataclass
class Work:
    """What the blockwise attention computed on this rank: matmul FLOPs, blocks, seconds (host
    time around the computation, communication excluded; meaningful on CPU ranks)."""

    flops: float = 0.0
    blocks: int = 0
    seconds: float = 0.0

    def add(self, other: "Work") -> None:
        self.flops, self.blocks, self.seconds = (self.flops + other.flops, self.blocks + other.blocks,
                                                 self.seconds + other.seconds)


def _chunks(x, n: int) -> list:
    return list(x.chunk(n, dim=-2))                         # views [b, n_heads, c, d]


def _widen(x, n: int):
    """[b, g, c, d] -> [b, n, c, d]: K/V head j serves query heads j*n/g .. (j+1)*n/g - 1."""
    return x if x.shape[1] == n else x.repeat_interleave(n // x.shape[1], dim=1)


def _fold(gx, g: int):
    """The inverse sum of :func:`_widen`: [b, n, c, d] -> [b, g, c, d]."""
    b, n, c, d = gx.shape
    return gx if n == g else gx.view(b, g, n // g, c, d).sum(2)


def _pairs(q_ids, k_ids, causal):
    for a, qi in enumerate(q_ids):
        for j, ki in enumerate(k_ids):
            kind = pair_kind(qi, ki, causal)
            if kind is not None:
                yield a, j, kind


def attend(q, k, v, q_ids, k_ids, acc=None, causal: bool = True, work: Work | None = None) -> list:
    """Merge the attention of ``q`` (chunks ``q_ids``) over the block ``k``, ``v`` (chunks
    ``k_ids``) into ``acc`` [(out, lse) or None per query chunk]; returns the updated list.
    q [b, n, len(q_ids)*c, d]; k, v [b, g, len(k_ids)*c, d] (g = n without GQA)."""
    t0 = time.perf_counter()
    n = q.shape[1]
    qs, ks, vs = _chunks(q, len(q_ids)), _chunks(_widen(k, n), len(k_ids)), _chunks(_widen(v, n), len(k_ids))
    acc = list(acc) if acc is not None else [None] * len(q_ids)
    for a, j, kind in _pairs(q_ids, k_ids, causal):
        mask = causal_mask(qs[a].shape[-2], q.device) if kind == "diag" else None
        part = block_attention(qs[a], ks[j], vs[j], mask)
        acc[a] = part if acc[a] is None else merge_partials(*acc[a], *part)
        if work is not None:                                # q k^T and p v: 2 matmuls
            work.flops += 4.0 * qs[a].shape[0] * qs[a].shape[1] * qs[a].shape[2] * ks[j].shape[2] * q.shape[-1]
            work.blocks += 1
    if work is not None:
        work.seconds += time.perf_counter() - t0
    return acc


def finish(acc, like) -> tuple:
    """(out [b, n, sq, d], lse [b, n, sq]) from the per-chunk results; a chunk that saw no key
    (impossible under causal attention: it sees itself) is out 0, lse -inf. ``like``: the queries."""
    n = len(acc)
    parts = []
    for a, r in enumerate(acc):
        if r is None:
            qa = _chunks(like, n)[a]
            r = (torch.zeros_like(qa), torch.full(qa.shape[:-1], NEG_INF, dtype=qa.dtype, device=qa.device))
        parts.append(r)
    return torch.cat([o for o, _ in parts], dim=-2), torch.cat([s for _, s in parts], dim=-1)


def attend_backward(q, k, v, out, lse, dout, delta, q_ids, k_ids, causal: bool = True,
                    work: Work | None = None) -> tuple:
    """(dq, dk, dv) of the block ``k``, ``v`` (chunks ``k_ids``): this block's share of the
    gradient of the queries, and the queries' contribution to the block's dK, dV. ``out``,
    ``lse`` are the final results of the queries, ``delta`` = rowsum(dout * out)."""
    t0 = time.perf_counter()
    nq, nk = len(q_ids), len(k_ids)
    qs, os_, ls, ds, dl = (_chunks(q, nq), _chunks(out, nq), list(lse.chunk(nq, dim=-1)),
                           _chunks(dout, nq), list(delta.chunk(nq, dim=-1)))
    g, k, v = k.shape[1], _widen(k, q.shape[1]), _widen(v, q.shape[1])
    ks, vs = _chunks(k, nk), _chunks(v, nk)
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    dqs, dks, dvs = _chunks(dq, nq), _chunks(dk, nk), _chunks(dv, nk)   # views: add in place
    for a, j, kind in _pairs(q_ids, k_ids, causal):
        mask = causal_mask(qs[a].shape[-2], q.device) if kind == "diag" else None
        gq, gk, gv = block_attention_backward(qs[a], ks[j], vs[j], os_[a], ls[a], ds[a], mask, dl[a])
        dqs[a] += gq
        dks[j] += gk
        dvs[j] += gv
        if work is not None:                                # scores, dv, dp, dq, dk: 5 matmuls
            work.flops += 10.0 * qs[a].shape[0] * qs[a].shape[1] * qs[a].shape[2] * ks[j].shape[2] * q.shape[-1]
            work.blocks += 1
    if work is not None:
        work.seconds += time.perf_counter() - t0
    return dq, _fold(dk, g), _fold(dv, g)

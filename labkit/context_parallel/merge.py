"""Attention over one K/V block, and the online-softmax merge of partial results (pure local math).

Chapter "Context parallelism". Under context parallelism a rank sees the keys and values of the
sequence one block at a time. Softmax attention still comes out exact if each block's result is
kept *normalized within the block* together with its log-sum-exp, and blocks are merged with the
online-softmax rule (Milakov & Gimelshein 2018; the same merge as FlashAttention, Dao et al. 2022,
and ring-flash-attention's ``update_out_and_lse``). For one query row and two blocks A and B with
scores x_A, x_B:

    lse_A = log sum_j exp(x_A,j)                      out_A = sum_j exp(x_A,j - lse_A) v_j
    lse   = log(exp(lse_A) + exp(lse_B))              computed as  m + log(e^(lse_A-m) + e^(lse_B-m)),
                                                      m = max(lse_A, lse_B): no exp ever overflows
    out   = e^(lse_A - lse) out_A + e^(lse_B - lse) out_B

A block where a row sees no key at all (causal masking) has lse = -inf and out = 0: it drops out
of the merge. :func:`block_attention_backward` is FlashAttention's backward for one block given the
FINAL output and lse, so the blocks' gradients can be computed one at a time, in any order.

Shapes: q [b, n, sq, d], k and v [b, n, sk, d], out [b, n, sq, d], lse [b, n, sq].
No communication here: ``ring_attention.py`` and ``allgather_attention.py`` call these per block.
"""
from __future__ import annotations

import math

import torch

NEG_INF = float("-inf")


def causal_mask(n: int, device=None) -> torch.Tensor:
    """[n, n] bool, True where query i must NOT see key j (j > i): a diagonal block."""
    return torch.ones(n, n, dtype=torch.bool, device=device).triu(1)


def block_scores(q, k, mask=None):
    """q k^T / sqrt(d) with masked entries -inf: [b, n, sq, sk]."""
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    return scores if mask is None else scores.masked_fill(mask, NEG_INF)


def block_attention(q, k, v, mask=None):
    """Attention of ``q`` over this block alone: (out normalized within the block, lse).

    ``mask`` [sq, sk] bool (True = hidden) or None. A row that sees no key gets out 0, lse -inf.
    """
    scores = block_scores(q, k, mask)                       # [b, n, sq, sk]
    lse = torch.logsumexp(scores, dim=-1)                   # [b, n, sq]; -inf if all hidden
    probs = torch.exp(scores - _finite(lse)[..., None])     # exp(-inf) = 0 on hidden entries
    return probs @ v, lse                                   # [b, n, sq, d], [b, n, sq]


def merge_partials(out_a, lse_a, out_b, lse_b):
    """The online-softmax merge of two partial results of the same queries -> (out, lse).

    Exact (up to round-off) whatever the scale of the scores: the larger lse is subtracted before
    exponentiating. Rows that are -inf in both stay out 0, lse -inf.
    """
    m = _finite(torch.maximum(lse_a, lse_b))               # [b, n, sq]; 0 where both are -inf
    w_a, w_b = torch.exp(lse_a - m), torch.exp(lse_b - m)   # in [0, 1]; 0 for a -inf side
    total = w_a + w_b                                       # >= 1 unless both sides are empty
    lse = m + torch.log(total)                              # log(0) = -inf for empty rows
    total = torch.where(total == 0, torch.ones_like(total), total)
    out = (w_a / total)[..., None] * out_a + (w_b / total)[..., None] * out_b
    return out, lse


def block_attention_backward(q, k, v, out, lse, dout, mask=None, delta=None):
    """Gradients (dq, dk, dv) of this block's share of the attention, FlashAttention's backward.

    ``out`` and ``lse`` are the FINAL (merged over all blocks) output and log-sum-exp of these
    queries, so p = exp(scores - lse) is the block of the full softmax. ``delta`` = rowsum(dout *
    out) [b, n, sq] (pass it once per query chunk; computed here if None).
        dv = p^T dout      dp = dout v^T      ds = p * (dp - delta)
        dq = ds k / sqrt(d)                   dk = ds^T q / sqrt(d)
    """
    scale = 1.0 / math.sqrt(q.shape[-1])
    if delta is None:
        delta = (dout * out).sum(dim=-1)                    # [b, n, sq]
    probs = torch.exp(block_scores(q, k, mask) - _finite(lse)[..., None])   # [b, n, sq, sk]
    dv = probs.transpose(-2, -1) @ dout                     # [b, n, sk, d]
    ds = probs * (dout @ v.transpose(-2, -1) - delta[..., None])
    return (ds @ k) * scale, (ds.transpose(-2, -1) @ q) * scale, dv


def _finite(x):
    """-inf -> 0 (a row with no visible key), so that x - max never computes -inf - (-inf)."""
    return torch.where(torch.isneginf(x), torch.zeros_like(x), x)

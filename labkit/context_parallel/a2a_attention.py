"""All-to-all context parallelism (``cp_comm_type="a2a"``): DeepSpeed-Ulysses.

Chapter "Context parallelism" (Jacobs et al. 2023, DeepSpeed Ulysses; Megatron-LM / Transformer
Engine's ``AttnFuncWithCPAndQKVOA2A``). Instead of passing K/V around, trade the sharded axis:
an all-to-all turns q, k, v from [b, n, s/c, d] (my tokens, all n heads) into [b, n/c, s, d]
(every token, my n/c heads); attention is then ordinary full-sequence attention of those heads
(here labkit's dense ``causal_attention``: any kernel works); a second all-to-all turns the
output back into [b, n, s/c, d]. Needs the heads (and, with group-query attention, the K/V
groups) per TP rank divisible by c; query head i of rank j's n/c then reads K/V head i // (n/g)
of its g/c, as on one device.

Per rank and layer, 4 all-to-alls of a [b, n, s/c, d] tensor each way (q, k, v, out forward; their
gradients backward), each sending (c-1)/c of it: the volume does not grow with c, and the
communication cannot overlap the attention it feeds. The gathered sequence arrives rank-major
(rank 0's chunks, then rank 1's, ...); it is put in sequence order for the causal mask and back.
"""
from __future__ import annotations

import torch

from ..groups import Group
from ..model import causal_attention
from .cp_comm import head_to_seq, seq_to_head
from .sharding import chunk_ids


def _rank_major(c: int, layout: str) -> list[int]:
    """Chunk index at each slot of the gathered sequence: rank 0's two chunks, rank 1's, ..."""
    return [i for r in range(c) for i in chunk_ids(r, c, layout)]


def _permute(x, order: list[int]):
    """Reorder the 2c chunks of the sequence (dim -2): slot j of the result is chunk order[j]."""
    chunks = x.chunk(len(order), dim=-2)
    return torch.cat([chunks[i] for i in order], dim=-2)


def a2a_attention(group: Group, q, k, v, layout: str = "balanced", causal: bool = True, work=None):
    """q, k, v [b, n, s/c, d] (this rank's tokens, ``sharding`` order) -> [b, n, s/c, d].

    Differentiable through autograd: the all-to-alls are conjugate pairs (``cp_comm``) and the
    attention is the dense one. ``work`` is accepted for a uniform signature and not used.
    """
    c = group.size
    slots = _rank_major(c, layout)                          # slot -> chunk
    to_seq = sorted(range(2 * c), key=slots.__getitem__)     # chunk -> slot: sequence order
    if k.shape[1] == q.shape[1]:
        qkv = seq_to_head(group, torch.stack([q, k, v]))     # [3, b, n/c, s, d], rank-major
        qs, ks, vs = _permute(qkv, to_seq)                   # sequence order
    else:   # group-query attention: q's n heads and K/V's g heads go in two all-to-alls (g % c == 0)
        qs = _permute(seq_to_head(group, q), to_seq)                         # [b, n/c, s, d]
        ks, vs = _permute(seq_to_head(group, torch.stack([k, v])), to_seq)   # [b, g/c, s, d] each
    if causal:
        out = causal_attention(qs, ks, vs)                   # [b, n/c, s, d]
    else:
        out = torch.softmax(qs @ ks.transpose(-2, -1) / qs.shape[-1] ** 0.5, dim=-1) @ vs
    return head_to_seq(group, _permute(out, slots))           # back to rank-major, then my tokens

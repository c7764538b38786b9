"""Which tokens a context-parallel rank holds: the load-balanced causal split, and the naive one.

Chapter "Context parallelism". The sequence of s tokens is cut into 2c chunks of s/(2c) tokens
(c = context_parallel_size). Under causal attention a token attends to every token before it, so
a contiguous split gives the last rank about 2c-1 times the work of the first. Megatron-LM gives
rank r the chunks r and 2c-1-r: one early, one late, the same work on every rank
(``_get_batch_on_this_cp_rank_per_sequence_balancing`` in ``megatron/core/utils.py``, d98e8a64;
the same scheme as Llama 3's context parallelism, Dubey et al. 2024, Sec. 3.3.2).

    layout "balanced"    rank r holds chunks (r, 2c-1-r)       c = 2: rank 0 -> 0, 3; rank 1 -> 1, 2
    layout "contiguous"  rank r holds chunks (2r, 2r+1)        c = 2: rank 0 -> 0, 1; rank 1 -> 2, 3

Tokens, labels and position ids are cut the same way (positions follow the tokens: the learned
position embedding of a token is that of its place in the full sequence). Everything but
:func:`shard`, :func:`unshard` and :func:`batch_transform` is plain Python.
"""
from __future__ import annotations

LAYOUTS = ("balanced", "contiguous")


def chunk_ids(cp_rank: int, cp: int, layout: str = "balanced") -> tuple[int, int]:
    """The two chunks (of 2c, in the order the rank stores them) context-parallel rank ``cp_rank`` holds."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    if not 0 <= cp_rank < cp:
        raise ValueError(f"cp_rank must be in [0, {cp}), got {cp_rank}")
    return (cp_rank, 2 * cp - 1 - cp_rank) if layout == "balanced" else (2 * cp_rank, 2 * cp_rank + 1)


def chunk_size(seq_length: int, cp: int) -> int:
    """Tokens per chunk, s / (2c); Megatron's rule: s divisible by 2c."""
    if seq_length % (2 * cp):
        raise ValueError(f"seq_length {seq_length} is not divisible by 2 * context_parallel_size = "
                         f"{2 * cp}: each rank holds 2 chunks of s / (2 * cp) tokens")
    return seq_length // (2 * cp)


def positions(seq_length: int, cp_rank: int, cp: int, layout: str = "balanced") -> list[int]:
    """Positions (in the full sequence) of the s/c tokens rank ``cp_rank`` holds, in its order."""
    c = chunk_size(seq_length, cp)
    return [i * c + j for i in chunk_ids(cp_rank, cp, layout) for j in range(c)]


def pair_kind(q_chunk: int, k_chunk: int, causal: bool = True) -> str | None:
    """How queries of chunk ``q_chunk`` see keys of chunk ``k_chunk``: "full" (every key is
    visible), "diag" (the same chunk: causal inside it) or None (all hidden: skip the block)."""
    if not causal or k_chunk < q_chunk:
        return "full"
    return "diag" if k_chunk == q_chunk else None


def causal_pairs(cp: int, layout: str = "balanced") -> list[int]:
    """Per rank, the (query chunk, key chunk) blocks causal attention must compute (a diagonal
    block counts as one): 2c+1 on every rank when balanced, 4r+3 on rank r when contiguous."""
    return [sum(pair_kind(a, b) is not None for a in chunk_ids(r, cp, layout) for b in range(2 * cp))
            for r in range(cp)]


def shard(x, cp_rank: int, cp: int, layout: str = "balanced", dim: int = 1):
    """This rank's part of ``x`` along ``dim`` (the sequence), Megatron's view + index_select."""
    import torch
    s = x.shape[dim]
    chunk_size(s, cp)
    parts = x.view(*x.shape[:dim], 2 * cp, s // (2 * cp), *x.shape[dim + 1:])
    index = torch.tensor(chunk_ids(cp_rank, cp, layout), device=x.device)
    kept = parts.index_select(dim, index)                  # [..., 2, s/(2c), ...]
    return kept.reshape(*x.shape[:dim], s // cp, *x.shape[dim + 1:])


def unshard(parts, layout: str = "balanced", dim: int = 1):
    """The inverse of :func:`shard`: every rank's part (rank order) -> the full sequence."""
    import torch
    cp = len(parts)
    chunks = {}
    for r, p in enumerate(parts):
        for i, piece in zip(chunk_ids(r, cp, layout), p.chunk(2, dim=dim)):
            chunks[i] = piece
    return torch.cat([chunks[i] for i in range(2 * cp)], dim=dim)


def batch_transform(cp_rank: int, cp: int, layout: str = "balanced"):
    """The Engine's microbatch transform: (tokens, labels) [b, s] -> this rank's (tokens, labels)
    [b, s/c] and position_ids [s/c] (the model's third forward argument)."""
    import torch

    def transform(mb):
        tokens, labels = mb[0], mb[1]
        pos = torch.tensor(positions(tokens.shape[1], cp_rank, cp, layout), device=tokens.device)
        return shard(tokens, cp_rank, cp, layout), shard(labels, cp_rank, cp, layout), pos
    return transform

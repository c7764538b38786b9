"""Megatron's dropout random streams: one replicated over tp, one different on every tp rank.

Chapter "Tensor parallelism", section on dropout. A dropout mask must be the SAME on every tp rank
where the activations are replicated (the ranks compute the same values; different masks would
make the replicas diverge), and DIFFERENT where each rank holds its own part (attention heads a/t,
sequence shards s/t under SP; equal masks would correlate the shards). Megatron keeps two CUDA RNG
states (``megatron/core/tensor_parallel/random.py``, ``model_parallel_cuda_manual_seed``, and
``megatron/training/initialize.py`` ``_set_random_seed``; commit d98e8a64):

    default stream          seed + 100 * pp_rank                       (same on every tp rank)
    model-parallel stream   seed + 100 * pp_rank + 2718 + tp_rank      (the "tracker", forked)

and forks the model-parallel one for the attention-probability dropout without SP
(``dot_product_attention.py``), for the whole transformer block under SP (``transformer_block.py``)
and for the embedding dropout under SP (``language_model_embedding.py``). labkit uses explicit
``torch.Generator`` objects instead of global state: every ``labkit.model.Dropout`` gets the one
generator of its region.
"""
from __future__ import annotations

import torch
from torch import nn

from ..model import Dropout

TP_SEED_OFFSET = 2718   # Megatron's offset of the model-parallel stream ("just for fun")
PP_SEED_STRIDE = 100    # Megatron's seed + 100 * pipeline rank


def stream_seeds(seed: int, pp_rank: int, tp_rank: int) -> dict[str, int]:
    """{"default": ..., "model_parallel": ...}: the two seeds of this rank, Megatron's formulas."""
    base = seed + PP_SEED_STRIDE * pp_rank
    return {"default": base, "model_parallel": base + TP_SEED_OFFSET + tp_rank}


def dropout_regions(model: nn.Module, sequence_parallel: bool) -> dict[str, str]:
    """{Dropout module name: "default" | "model_parallel"}: which stream each dropout draws from."""
    regions = {}
    for name, m in model.named_modules():
        if not isinstance(m, Dropout):
            continue
        if name.endswith("core_attention.attention_dropout"):
            regions[name] = "model_parallel"       # heads differ per tp rank, with or without SP
        else:                                       # embedding and hidden dropouts
            regions[name] = "model_parallel" if sequence_parallel else "default"
    return regions


def apply_rng_streams(chunks, seed: int, pp_rank: int, tp_rank: int, sequence_parallel: bool,
                      device) -> dict[str, torch.Generator]:
    """Point every Dropout of this rank's model chunks at its stream; returns the generators (one
    pair per rank, shared by its pipeline chunks, as Megatron's per-process RNG states are)."""
    gens = {k: torch.Generator(device=device).manual_seed(v)
            for k, v in stream_seeds(seed, pp_rank, tp_rank).items()}
    for chunk in chunks:
        for name, region in dropout_regions(chunk, sequence_parallel).items():
            chunk.get_submodule(name).generator = gens[region]
    return gens

"""Split the dense model into this rank's pipeline stages (the first step of ``labkit.parallelize``).

Chapters "Pipeline parallelism" and "Interleaved pipeline" (Narayanan et al. 2021, Sec. 2.2).
With p pipeline ranks and v model chunks per rank there are S = p*v virtual stages; rank r holds
stages r, r+p, ..., r+(v-1)p (Megatron-LM's placement), each a contiguous block of layers. Stage 0
also holds the embedding; stage S-1 the final norm, the output layer and the loss. Each chunk is a
``labkit.model.GPT`` sharing the dense model's modules (``GPT.part``), so the later plans (TP, CP,
EP) and the one forward apply to it unchanged, and its parameters keep the dense names.

A tied output layer is the word embedding itself; when the first and the last stage are different
ranks, the last stage gets its own copy (``output_layer.weight``), as Megatron does, and both copies
are tagged ``shared_embedding``; their gradients are summed over the embedding group after each
backward, so the copies stay equal. The last stage's copy is also tagged ``shared``: the gradient
norm counts it once (labkit/param_attrs.py).
"""
from __future__ import annotations

from torch import nn

from ..model import OutputLayer
from ..param_attrs import tag


def stage_of(rank: int, chunk: int, pp: int) -> int:
    """Virtual stage held by ``rank`` as its model chunk ``chunk`` (Megatron's placement)."""
    return chunk * pp + rank


def split(model, cfg, pp_rank: int) -> list:
    """This pp rank's model chunks [chunk 0, chunk 1, ...] of the dense ``model`` (a GPT).

    ``cfg``: a ``labkit.config.TrainConfig`` (pp size, virtual stages, and the layers of each).
    """
    pp, v = cfg.pipeline_model_parallel_size, cfg.virtual_pipeline_size()
    last = pp * v - 1
    chunks = []
    for c in range(v):
        s = stage_of(pp_rank, c, pp)
        chunk = model.part(cfg.stage_layers(s), pre_process=(s == 0), post_process=(s == last))
        tied = model.output_layer.weight is None
        if tied and last > 0 and s == 0:
            tag(model.embedding.word_embeddings.weight, shared_embedding=True)
        if tied and last > 0 and s == last:               # its own copy of the word embeddings
            out = OutputLayer(model.cfg)                  # tied config: no weight of its own yet
            out.weight = nn.Parameter(model.embedding.word_embeddings.weight.detach().clone())
            tag(out.weight, shared_embedding=True, shared=True)
            chunk.output_layer = out
        chunks.append(chunk)
    return chunks


def dense_name(name: str, param) -> str:
    """The dense model's name of a chunk parameter (the last stage's tied copy is the embedding)."""
    return "embedding.word_embeddings.weight" if getattr(param, "shared", False) else name


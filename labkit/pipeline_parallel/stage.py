"""Split the dense model into this rank's pipeline stages (the first step of ``labkit.parallelize``).

Chapters "Pipeline parallelism" and "Interleaved pipeline" (Narayanan et al. 2021, Sec. 2.2).
With p pipeline ranks and v model chunks per rank there are S = p*v virtual stages; which ones rank
r holds is ``placement.py``'s answer for the run's schedule (Megatron-LM's r, r+p, ..., r+(v-1)p
for 1F1B and interleaved 1F1B), each a contiguous block of layers. Stage 0
also holds the embedding; stage S-1 the final norm, the output layer and the loss. Each chunk is a
``labkit.model.GPT`` sharing the dense model's modules (``GPT.part``), so the later plans (TP, CP,
EP) and the one forward apply to it unchanged, and its parameters keep the dense names.

A tied output layer is the word embedding itself. Which ranks hold the ends is the placement's
answer (``placement.end_ranks``). When the first and the last stage are different ranks (the loop),
the last stage gets its own copy (``output_layer.weight``), as Megatron does, and both copies
are tagged ``shared_embedding``; their gradients are summed over the embedding group after each
backward, so the copies stay equal. In the shard plan both copies are one dense parameter held by
the two ranks of the embedding group, summed over it; the first stage's copy is the one the
gradient norm counts (Megatron's ``shared`` tag on the other: ``param_is_not_shared``). When one
rank holds both ends (the V), its last chunk reads that rank's own embedding (``GPT.part(tied_to=)``):
one parameter, no copy, no sum; autograd adds both uses into its gradient, as on one device.
"""
from __future__ import annotations

from torch import nn

from .. import shard_plan as sp_
from ..modules import role
from ..model import OutputLayer
from ..param_attrs import tag
from .placement import end_ranks, placement_of, rank_stages, stage_of  # noqa: F401 - stage_of: the one placement

EMBEDDING = "embedding.word_embeddings.weight"


def split(model, cfg, pp_rank: int, plan: sp_.ShardPlan | None = None) -> list:
    """This pp rank's model chunks [chunk 0, chunk 1, ...] of the dense ``model`` (a GPT).

    ``cfg``: a ``labkit.config.TrainConfig`` (pp size, virtual stages, the schedule and so the
    placement). ``plan``: the dense model's shard plan, refined in place to what this rank holds.
    """
    pp, v = cfg.pipeline_model_parallel_size, cfg.virtual_pipeline_size()
    placement, last = placement_of(cfg.schedule_name()), pp * v - 1
    tied = model.output_layer.weight is None
    first_rank, last_rank = end_ranks(pp, v, placement)
    copied = tied and first_rank != last_rank             # the tie crosses ranks: two copies
    chunks, copy = [], None
    for s in rank_stages(pp_rank, pp, v, placement):
        borrow = tied and not copied and s == last and s > 0   # the embedding is another chunk's here
        chunk = model.part(cfg.stage_layers(s), pre_process=(s == 0), post_process=(s == last),
                           tied_to=model.embedding if borrow else None)
        if copied and s == last:                          # its own copy of the word embeddings
            out = role(OutputLayer(model.cfg), "output")  # tied config: no weight of its own yet
            out.weight = copy = nn.Parameter(model.embedding.word_embeddings.weight.detach().clone())
            chunk.output_layer = out
        chunks.append(chunk)
    if plan is not None:
        held = {n for c in chunks for n, _ in c.named_parameters()}
        for name in set(plan) - held:
            del plan[name]
        if copied:                                        # both copies: summed over the embd group
            if EMBEDDING in held:
                plan[EMBEDDING] = plan[EMBEDDING].with_replicas("embd", 0, 2, summed=True)
            if copy is not None:
                entry = sp_.ParamShard(EMBEDDING, tuple(copy.shape), dp_index=next(iter(plan.values())).dp_index)
                plan["output_layer.weight"] = entry.with_replicas("embd", 1, 2, summed=True)
        for c in chunks:
            for n, p in c.named_parameters():
                tag(p, **plan[n].tags())
    return chunks


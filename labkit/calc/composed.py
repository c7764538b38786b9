"""Bytes per rank per step of a composed layout (TP x SP x PP x VPP x DP/ZeRO-1), as labkit runs it.

Chapter "Putting it together: PTD-P". ``labkit_step_bytes`` adds up every collective and message
of one optimizer step on one rank, term by term, for labkit's GPT (learned positions, biases,
LayerNorm) and its implementation; ``labkit.train`` counts the same bytes on its process groups,
and the chapter and tests/test_composition.py (``test_bytes_per_group_equal_calc``) compare the
two exactly. Conventions are labkit.comm's:
ring all-reduce 2(n-1)/n N, all-gather / reduce-scatter (n-1)/n N (N: the full tensor), a p2p
message its own bytes, plus 3 int64 (24 B) naming it.

Per microbatch, N = s*b*h*e (the full activation), t = TP, on the ranks that hold the part:
  every layer         tp_layer_bytes: 4 all-reduces of N (TP), or 4 all-gathers + 4 reduce-scatters of N (SP)
  embedding (stage 0) f-bar: all-reduce N;  under SP also the scatter's backward, an all-gather of N
  output layer (last) f's backward, all-reduce N;  under SP g (all-gather N) and its reduce-scatter
  loss (last)         labkit's vocab-parallel CE: all-gather of the t local maxima [b, s], all-reduce
                      of the target logit and of the softmax denominator [b, s] (Megatron's
                      cross_entropy.py all-reduces the maximum instead of gathering it)
  pipeline            each boundary a chunk has: activation forward, its gradient backward, [b, s/t, h]
Per step:
  SP gradients        all-reduce over tp of the norms' and the row-parallel biases' gradients
  data parallel       dp_step_bytes of this rank's parameters (ZeRO-1: per bucket, padded shards)
  tied embedding      all-reduce over the embedding group (first and last stage) of the [V/t, h]
                      gradient (under ZeRO-1 too: the whole gradient buffer exists, as in Megatron)
"""
from __future__ import annotations

import math

from .comm import all_gather_bytes, reduce_scatter_bytes, ring_all_reduce_bytes, tp_layer_bytes
from .config import ModelConfig, ParallelConfig
from .params import embedding_params, layer_params, placement


def _add(acc: dict, axis: str, op: str, nbytes: float) -> None:
    if nbytes:
        acc.setdefault(axis, {})
        acc[axis][op] = acc[axis].get(op, 0.0) + nbytes


def labkit_step_bytes(model: ModelConfig, par: ParallelConfig, pp_rank: int = 0,
                      bytes_per_element: int = 4) -> dict[str, dict[str, float]]:
    """{group: {op: bytes}} a rank with pipeline rank ``pp_rank`` sends in one optimizer step.

    Groups are labkit's: "tp", "pp", "dp" (dp x cp when CP > 1 is not covered here), "embd".
    ZeRO stages 2 and 3 are not covered (labkit refuses them with pipelines; see dp_step_bytes).
    """
    if par.cp > 1 or par.ep > 1 or par.optimizer_shard_stage > 1:
        raise ValueError("labkit_step_bytes covers TP, SP, PP, VPP, DP and ZeRO-1 only")
    t, p, d, e = par.tp, par.pp, par.dp, bytes_per_element
    s, b, h = model.seq_length, par.micro_batch_size, model.hidden_size
    from ..pipeline_parallel.placement import embedding_ranks, hands_off_locally, rank_stages
    v, where = placement(model, par)                  # the schedule's placement (loop or V)
    m = par.gbs // (b * d)
    sp = par.sequence_parallel and t > 1
    stages = rank_stages(pp_rank, p, v, where)
    first, last = 0 in stages, p * v - 1 in stages
    tied = not model.untie_embeddings_and_output_weights
    copied = tied and len(embedding_ranks(p, v, where)) > 1   # the ends on two ranks: two copies
    N = s * b * h * e
    out: dict = {}
    # -- tensor parallelism, per microbatch ----------------------------------------------------
    if t > 1:
        per_layer = tp_layer_bytes(s, b, h, t, e, sequence_parallel=sp)
        for op, nbytes in per_layer.items():
            _add(out, "tp", op, m * (model.num_layers // p) * nbytes)
        if first:
            _add(out, "tp", "all_reduce", m * ring_all_reduce_bytes(N, t))
            if sp:
                _add(out, "tp", "all_gather", m * all_gather_bytes(N, t))
        if last:
            if sp:
                _add(out, "tp", "all_gather", m * all_gather_bytes(N, t))
                _add(out, "tp", "reduce_scatter", m * reduce_scatter_bytes(N, t))
            else:
                _add(out, "tp", "all_reduce", m * ring_all_reduce_bytes(N, t))
            _add(out, "tp", "all_gather", m * all_gather_bytes(t * b * s * e, t))   # the t maxima
            _add(out, "tp", "all_reduce", m * 2 * ring_all_reduce_bytes(b * s * e, t))
        if sp:   # after the backward: 2 norms (w, b) and 2 row-parallel biases per layer
            elems = (model.num_layers // p) * 6 * h + (2 * h if last else 0)
            _add(out, "tp", "all_reduce", ring_all_reduce_bytes(elems * e, t))
    # -- pipeline parallelism, per microbatch --------------------------------------------------
    if p > 1:
        act = b * (s // t if sp else s) * h * e
        msgs = sum(m * ((st < p * v - 1 and not hands_off_locally(st, p, v, where))     # a local
                        + (st > 0 and not hands_off_locally(st - 1, p, v, where)))   # hand-off: no message
                   for st in stages)
        _add(out, "pp", "send", msgs * act)
        _add(out, "pp", "p2p_header", msgs * 24)
    # -- data parallelism and the tied embedding, per step -------------------------------------
    word = model.padded_vocab_size(t) * h // t
    per_layer = layer_params(model, t)["dense"]
    params = (model.num_layers // p) * per_layer
    params += embedding_params(model, t) if first else 0
    params += 2 * h if last else 0                                   # final layer norm
    shared = 0
    if last and (not tied or copied):                                # own output weight
        if tied:
            shared += word
        else:
            params += word
    if first and copied:
        params -= word                                               # in the shared bucket
        shared += word
    zero = par.optimizer_shard_stage
    for bucket in (params, shared):
        if not bucket or d == 1:
            continue
        if zero == 0:
            _add(out, "dp", "all_reduce", ring_all_reduce_bytes(bucket * e, d))
        else:
            padded = math.ceil(bucket / d) * d
            _add(out, "dp", "reduce_scatter", reduce_scatter_bytes(padded * e, d))
            _add(out, "dp", "all_gather", all_gather_bytes(padded * e, d))
    if copied and (first or last):
        _add(out, "embd", "all_reduce", ring_all_reduce_bytes(word * e, 2))
    return out

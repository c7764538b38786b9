"""Parameter counts, exact, in Megatron's module layout (labkit's own model; chapter "Why parallelism").

One transformer layer of ``labkit.model`` / Megatron ``GPTModel`` holds

    input_layernorm        h (RMSNorm) or 2h (LayerNorm: weight + bias)
    linear_qkv             h*(q + 2kv) + bias (q + 2kv)     q = kv_channels*a, kv = kv_channels*g
    q_/k_layernorm         2 d or 4 d with --qk-layernorm   (a norm over one head's d = kv_channels)
    linear_proj            q*h + bias h
    pre_mlp_layernorm      h or 2h
    mlp.linear_fc1         h*f*k + bias f*k                 k = 2 with SwiGLU (gate and up), else 1
    mlp.linear_fc2         f*h + bias h
    (MoE layer: router h*E, then E experts each fc1 + fc2 with moe_ffn, plus a shared expert)

Under TP (Shoeybi et al. 2019) column-parallel weights and biases (qkv, fc1) and row-parallel
weights (proj, fc2) are split t ways; row-parallel biases and norms are replicated. Expert
weights are split over EP (whole experts) and ETP (each expert's fc1/fc2, like TP). Megatron's own estimate (``megatron.py``) ignores biases and
position embeddings; this count does not, so it matches ``sum(p.numel())`` of the real model.
"""
from __future__ import annotations

from .config import ModelConfig, ParallelConfig, virtual_pipeline_size


def _norm(model: ModelConfig) -> int:
    return (2 if model.normalization == "LayerNorm" else 1) * model.hidden_size


def _mlp(model: ModelConfig, ffn: int, tp: int) -> int:
    """fc1 (column-parallel) + fc2 (row-parallel) on one TP rank."""
    h, k, bias = model.hidden_size, (2 if model.swiglu else 1), model.add_bias_linear
    fc1 = (h * ffn * k + (ffn * k if bias else 0)) // tp
    fc2 = ffn * h // tp + (h if bias else 0)
    return fc1 + fc2


def layer_params(model: ModelConfig, tp: int = 1, ep: int = 1, moe: bool = False,
                 etp: int | None = None) -> dict:
    """Parameters of one layer on one rank, split into "dense" (sharded by ZeRO over DP*CP) and
    "expert" (the routed experts: E/EP of them, each cut ETP ways (``etp``, default TP); ZeRO shards
    them over the expert-data-parallel ranks)."""
    h, bias = model.hidden_size, model.add_bias_linear
    q = model.kv_channels * model.num_attention_heads
    kv = model.kv_channels * model.query_groups
    qkv = (h * (q + 2 * kv) + ((q + 2 * kv) if bias else 0)) // tp
    proj = q * h // tp + (h if bias else 0)
    qk_norm = 2 * _norm(model) * model.kv_channels // h if model.qk_layernorm else 0   # over head_dim
    dense = 2 * _norm(model) + qk_norm + qkv + proj
    expert = 0
    if not moe:
        dense += _mlp(model, model.ffn_hidden_size, tp)
    else:
        dense += h * model.num_experts  # router, replicated
        if model.moe_shared_expert_intermediate_size:
            dense += _mlp(model, model.moe_shared_expert_intermediate_size, tp)
        expert = (model.num_experts // ep) * _mlp(model, model.moe_ffn_hidden_size, etp or tp)
    return {"dense": dense, "expert": expert}


def embedding_params(model: ModelConfig, tp: int = 1) -> int:
    """Word embeddings (vocab-parallel, split by TP) plus learned positions (replicated)."""
    word = model.padded_vocab_size(tp) * model.hidden_size // tp
    pos = model.seq_length * model.hidden_size if model.position_embedding_type == "learned_absolute" else 0
    return word + pos


def placement(model: ModelConfig, par: ParallelConfig) -> tuple[int, str]:
    """(v chunks per rank, placement) of the run: the schedule's (``par.pipeline_schedule``; None:
    Megatron's, the loop). ``labkit.pipeline_parallel.placement`` is the one owner of the answers."""
    from ..pipeline_parallel.placement import default_schedule, placement_of
    v = virtual_pipeline_size(model, par)
    return v, placement_of(par.pipeline_schedule or default_schedule(v))


def stage_layers(model: ModelConfig, par: ParallelConfig, stage: int) -> list:
    """Indices of the layers pipeline rank ``stage`` holds (Megatron's loop: v chunks, the virtual
    stages stage, stage + pp, ...; the V: stage and 2pp-1-stage; ``placement.rank_layers``)."""
    from ..pipeline_parallel.placement import rank_layers
    return rank_layers(model.num_layers, stage, par.pp, *placement(model, par))


def holds_ends(model: ModelConfig, par: ParallelConfig, stage: int) -> tuple[bool, bool]:
    """(holds the first stage, holds the last) for pipeline rank ``stage`` (``placement.holds_ends``)."""
    from ..pipeline_parallel.placement import holds_ends as ends
    return ends(stage, par.pp, *placement(model, par))


def stage_params(model: ModelConfig, par: ParallelConfig, stage: int) -> dict:
    """Parameters on one rank of pipeline rank ``stage``: {"dense": ..., "expert": ...}.

    The rank with the first stage holds the embeddings; the one with the last stage the final
    norm and the output layer (``holds_ends``: the placement's answer). With tied embeddings and
    the ends on two ranks (the loop, PP > 1) the last keeps its own copy of the word embeddings
    (Megatron all-reduces the two copies' gradients), so both ends hold V*h/t; one rank holding
    both ends (PP 1, or the V) holds the word embeddings once.
    """
    tp, ep, pattern = par.tp, par.ep, model.moe_layers()
    dense = expert = 0
    for i in stage_layers(model, par, stage):
        c = layer_params(model, tp, ep, moe=bool(pattern[i]), etp=par.etp)
        dense += c["dense"]
        expert += c["expert"]
    word = model.padded_vocab_size(tp) * model.hidden_size // tp
    first, last = holds_ends(model, par, stage)
    if first:
        dense += embedding_params(model, tp)
    if last:
        dense += _norm(model)
        if model.untie_embeddings_and_output_weights or not first:
            dense += word
    return {"dense": dense, "expert": expert}


def total_params(model: ModelConfig) -> int:
    """All parameters of the model on one device (tied output layer counted once)."""
    one = ParallelConfig(world_size=1)
    c = stage_params(model, one, 0)
    return c["dense"] + c["expert"]


def active_params(model: ModelConfig) -> int:
    """Parameters one token uses: an MoE layer counts only its top-k experts."""
    if model.num_experts is None:
        return total_params(model)
    per_expert = _mlp(model, model.moe_ffn_hidden_size, 1)
    n_moe = sum(model.moe_layers())
    return total_params(model) - n_moe * (model.num_experts - model.moe_router_topk) * per_expert

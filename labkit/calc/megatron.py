"""Megatron-LM's own estimate, reproduced exactly (chapter "Why parallelism", section "Megatron-LM's own numbers").

Megatron-LM prints, after the first iterations, "Theoretical memory footprints: weight and
optimizer=... MB, activation=... MB" (``megatron/training/theoretical_memory_usage.py``) and counts
FLOPs per iteration for its TFLOP/s log (``num_floating_point_operations`` in
``megatron/training/training.py``). ``megatron_estimate`` computes the same numbers, to the byte,
from the same arguments. Transcribed from NVIDIA/Megatron-LM commit d98e8a64 (2026-08-22); the
arguments, their defaults and the rules come from ``megatron_args.py``.

Weights and optimizer state, per GPU of the first pipeline stage, in three storage classes:

- TP-sharded (attention, dense MLPs, shared experts, embedding): / TP;
- replicated across TP (layer norms, the router and its bias, the shared-expert gate, MoE latent
  projections, the final norm): not divided by TP;
- routed experts: / (EP x ETP), their optimizer state sharded over the expert-data-parallel size
  world / (ETP x EP x PP) instead of DP.

Bytes per parameter: 18 (bf16 weight, fp32 gradient, fp32 master weight and Adam moments), or
6 + 12 / DP with the distributed optimizer, for every precision ("This estimator assumes bf16
training", theoretical_memory_usage.py line 294): an ``--fp16`` run holds 20, or 4 + 16 / DP
(``calc.MEGATRON_FP16``, Megatron's own table in docs/user-guide/features/dist_optimizer.md). Megatron's own simplifications are kept (they are what
it prints): only the first pipeline stage, no linear biases besides the router's, no position
embeddings, context parallelism ignored in the activations, the activation formula with SP +
selective recompute ignores GQA, the one without adds 5%. labkit's fuller model (memory.py)
differs in these points; the chapter lists where and why.
"""
from __future__ import annotations

from .megatron_args import megatron_args

# Neither branch of Megatron's activation formula has Korthikanti's 5as/h score term: it counts
# memory as a fused (flash) kernel keeps it, whatever --attention-backend and recompute say.
ATTENTION_NOTE = "flash (Megatron's formula has no s x s score term)"

__all__ = ["megatron_args", "megatron_estimate", "weight_breakdown", "weight_and_optimizer_bytes",
           "activation_bytes", "flops_per_iteration"]


def _moe_pattern(a) -> list:
    if a.num_experts is None:
        return [0] * a.num_layers
    if isinstance(a.moe_layer_freq, int):
        return [1 if i % a.moe_layer_freq == 0 else 0 for i in range(a.num_layers)]
    return list(a.moe_layer_freq)  # its length was checked in megatron_args


def _attention_params(a, norm: int) -> float:
    h, heads = a.hidden_size, a.num_attention_heads
    if a.multi_latent_attention:
        q_heads = heads * (a.qk_head_dim + a.qk_pos_emb_head_dim)
        q_term = h * q_heads if a.q_lora_rank is None else a.q_lora_rank * (h + q_heads + norm)
        return (q_term + a.kv_lora_rank * (h + heads * (a.qk_head_dim + a.v_head_dim) + norm)
                + h * a.qk_pos_emb_head_dim + heads * a.v_head_dim * h)
    groups = a.num_query_groups if a.group_query_attention else heads
    return 2 * h * h * ((1 + groups / heads) * (a.kv_channels * heads / h))


def weight_breakdown(a) -> dict:
    """Parameters on the most loaded shard (first stage) by storage class, and the DP sizes."""
    h, moe = a.hidden_size, a.num_experts is not None
    experts = a.num_experts if moe else 1
    gated = 3 / 2 if a.swiglu else 1
    norm = 1 if a.normalization == "RMSNorm" else 2                # RMSNorm has no bias
    pattern = _moe_pattern(a)
    n_moe = sum(pattern)
    n_dense = a.num_layers - n_moe
    mtp_moe = pattern[-1] * (a.mtp_num_layers or 0)
    mtp_dense = (1 - pattern[-1]) * (a.mtp_num_layers or 0)
    attn = _attention_params(a, norm)
    dense_mlp = 2 * h * a.ffn_hidden_size * gated
    shared = 2 * h * (a.moe_shared_expert_intermediate_size or 0) * gated
    routed = 2 * (a.moe_latent_size or h) * (a.moe_ffn_hidden_size if moe else 0) * experts * gated
    latent = 2 * h * a.moe_latent_size if moe and a.moe_latent_size is not None else 0
    layernorms = 2 * h * norm                                      # two norms per layer
    router = h * experts + (experts if a.add_bias_linear else 0) if moe else 0
    gate = h if a.moe_shared_expert_intermediate_size and a.moe_shared_expert_gate else 0
    replicated_moe = layernorms + latent + router + gate
    tp_block = (attn + dense_mlp) * n_dense + (attn + shared) * n_moe
    tp_mtp = (attn + dense_mlp) * mtp_dense + (attn + shared) * mtp_moe
    rep_block = layernorms * n_dense + replicated_moe * n_moe + norm * h   # + final norm
    rep_mtp = layernorms * mtp_dense + replicated_moe * mtp_moe
    embedding = h * a.padded_vocab_size
    tp, pp = a.tensor_model_parallel_size, a.pipeline_model_parallel_size
    etp, ep = a.expert_tensor_parallel_size, a.expert_model_parallel_size
    tp_sharded = (tp_block / pp + tp_mtp + embedding) / tp
    if a.untie_embeddings_and_output_weights and pp == 1:
        tp_sharded += embedding / tp                               # the output layer
    return {"tp_sharded": tp_sharded, "replicated": rep_block / pp + rep_mtp,
            "expert": (routed * n_moe / pp + routed * mtp_moe) / (etp * ep),
            "data_parallel_size": a.data_parallel_size,
            "expert_data_parallel_size": a.world_size // (etp * ep * pp)}


def _bytes_per_param(a, dp: int) -> float:
    return 6 + 12 / dp if a.use_distributed_optimizer else 18


def weight_and_optimizer_bytes(a) -> float:
    """compute_weight_and_optimizer_memory: dense classes over DP, experts over expert-DP."""
    w = weight_breakdown(a)
    return ((w["tp_sharded"] + w["replicated"]) * _bytes_per_param(a, w["data_parallel_size"])
            + w["expert"] * _bytes_per_param(a, w["expert_data_parallel_size"]))


def _pipeline_factor(a, act):
    """The interleaving penalty, or the discount when fewer microbatches than stages."""
    pp, vpp, m = a.pipeline_model_parallel_size, a.virtual_pipeline_model_parallel_size, a.num_microbatches
    if vpp is not None:
        act *= 1 + (pp - 1) / (pp * vpp)
    if vpp is None and pp > 1 and m is not None:
        act *= min(1, m / pp)
    return act


def activation_bytes(a) -> float:
    """compute_activation_memory (SP + selective) or compute_activation_memory_without_sp."""
    s, b, h = a.seq_length, a.micro_batch_size, a.hidden_size
    tp, pp = a.tensor_model_parallel_size, a.pipeline_model_parallel_size
    sp_selective = a.sequence_parallel and a.recompute_granularity == "selective"
    if sp_selective:  # Korthikanti et al. 2022, Table 2, 34 -> 18 + 4*ffn/h, then / TP
        act = s * b * h * (18 + 4 * (a.ffn_hidden_size / h)) * a.num_layers
    else:
        act = s * b * h * (10 + 24 / tp) * a.num_layers
    act += 8 * s * b * pp            # input to embedding, pp microbatches in flight
    act += s * b * h * pp            # embedding dropout mask
    act = _pipeline_factor(a, act)
    if sp_selective:
        if pp == 1:                  # inputs to output layer and CE loss
            act += s * b * h * 4 * (1 + a.padded_vocab_size / h)
        return act / tp
    if pp == 1:
        act += (s * b * a.padded_vocab_size / tp + s * b * h) * 2
    return act * 1.05


def flops_per_iteration(a, batch_size=None) -> float:
    """num_floating_point_operations(args, batch_size) for a standard Transformer (MFU's count)."""
    b = a.global_batch_size if batch_size is None else batch_size
    h, s, heads = a.hidden_size, a.seq_length, a.num_attention_heads
    groups = a.num_query_groups if a.group_query_attention else heads
    pattern = _moe_pattern(a)
    n_moe, topk = sum(pattern), (a.moe_router_topk if a.num_experts is not None else 0)
    n_dense = a.num_layers - n_moe
    mtp = a.mtp_num_layers or 0
    n_moe += pattern[-1] * mtp
    n_dense += (1 - pattern[-1]) * mtp
    n_layers = a.num_layers + mtp
    moe_ffn = a.moe_ffn_hidden_size if a.moe_ffn_hidden_size is not None else a.ffn_hidden_size
    shared = a.moe_shared_expert_intermediate_size or 0
    ffn_x = 3 if a.swiglu else 2
    k = 3 * 2  # forward + two backward GEMMs, 2 FLOPs per multiply-add
    if a.multi_latent_attention:
        q_heads = heads * (a.qk_head_dim + a.qk_pos_emb_head_dim)
        q_term = h * q_heads if a.q_lora_rank is None else a.q_lora_rank * (h + q_heads + 1)
        attn = k * (q_term + a.kv_lora_rank * (h + heads * (a.qk_head_dim + a.v_head_dim) + 1)
                    + h * a.qk_pos_emb_head_dim + heads * a.v_head_dim * h)
        core = k * (q_heads / 2 + heads * a.v_head_dim / 2)
    else:
        q = a.kv_channels * heads
        kv = a.kv_channels * groups
        gate = q if a.attention_output_gate else 0
        attn = k * (h * (q + 2 * kv + gate) + q * h)
        core = k * q / 2 * 2         # QK^T and (QK^T)V, causal mask halves them
    if a.moe_latent_size is None:
        routed = moe_ffn * topk * ffn_x
    else:
        routed = moe_ffn * topk * ffn_x * a.moe_latent_size / h + 2 * a.moe_latent_size
    mlp = k * h * (a.ffn_hidden_size * ffn_x * n_dense + routed * n_moe + shared * ffn_x * n_moe)
    mtp_extra = k * mtp * (3 * h + 2 * h * h)
    logits = k * h * a.padded_vocab_size * (mtp + 1)
    tokens = b * s                   # BSHD: sum of L_i = b*s, sum of L_i^2 = b*s^2
    return tokens * (mlp + attn * n_layers + mtp_extra + logits) + tokens * s * core * n_layers


def megatron_estimate(world_size: int, **megatron_args_kw) -> dict:
    """Megatron-LM's numbers for a launch: bytes per GPU (first pipeline stage) and FLOPs.

    >>> e = megatron_estimate(world_size=8, num_layers=2, hidden_size=64, num_attention_heads=4,
    ...                       seq_length=32, vocab_size=128, micro_batch_size=2)
    >>> e["data_parallel_size"], e["num_microbatches"]
    (8, 1)
    """
    a = megatron_args(world_size, **megatron_args_kw)
    w = weight_and_optimizer_bytes(a)
    act = activation_bytes(a)
    mb = 1024 * 1024
    return {"weight_and_optimizer_bytes": w, "activation_bytes": act, "total_bytes": w + act,
            "flops_per_iteration": flops_per_iteration(a),
            "params_on_most_loaded_shard": weight_breakdown(a),
            "data_parallel_size": a.data_parallel_size, "num_microbatches": a.num_microbatches,
            "padded_vocab_size": a.padded_vocab_size, "notes": list(a.notes),
            "activation_formula": ("with SP (selective recompute)" if a.sequence_parallel
                                   and a.recompute_granularity == "selective" else "without SP"),
            "attention": ATTENTION_NOTE,
            "report": (f"Theoretical memory footprints: weight and optimizer={w / mb:.2f} MB, "
                       f"activation={act / mb:.2f} MB, total={(w + act) / mb:.2f} MB")}

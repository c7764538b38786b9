"""Megatron-LM's own estimate, reproduced exactly (chapter "Why parallelism", section "Megatron-LM's own numbers").

Megatron-LM prints, after the first iterations, "Theoretical memory footprints: weight and
optimizer=... MB, activation=... MB" (``megatron/training/theoretical_memory_usage.py``) and counts
FLOPs per iteration for its TFLOP/s log (``num_floating_point_operations`` in
``megatron/training/training.py``). ``megatron_estimate`` computes the same numbers, to the byte,
from the same arguments. Written from the formulas of NVIDIA/Megatron-LM at commits 00caa53a
(theoretical_memory_usage.py) and 001b00c2 (training.py), the newest stored versions, taken as
core_v0.19; the argument defaults are those of megatron/training/arguments.py.

The formulas' own simplifications are kept on purpose (they are what Megatron prints): only the
first pipeline stage is estimated, linear biases and position embeddings are not counted, the
activation formula with SP + selective recompute ignores GQA and CP, the one without adds 5%.
labkit's fuller model (memory.py) differs in these points; the chapter lists where and why.
Hybrid (Mamba/linear-attention) models are not covered: Megatron does not estimate their memory.
"""
from __future__ import annotations

import math
from types import SimpleNamespace

# Megatron-LM argument defaults (arguments.py) for everything the estimate reads.
DEFAULTS = dict(
    tensor_model_parallel_size=1, pipeline_model_parallel_size=1, context_parallel_size=1,
    expert_model_parallel_size=1, num_layers_per_virtual_pipeline_stage=None,
    num_virtual_stages_per_pipeline_rank=None, sequence_parallel=False, micro_batch_size=1,
    global_batch_size=None, use_distributed_optimizer=False, recompute_granularity=None,
    recompute_activations=False, ffn_hidden_size=None, kv_channels=None,
    group_query_attention=None, num_query_groups=None, seq_length=2048, vocab_size=None,
    padded_vocab_size=None, make_vocab_size_divisible_by=128, swiglu=False,
    normalization="LayerNorm", untie_embeddings_and_output_weights=False, num_experts=None,
    moe_router_topk=2, moe_ffn_hidden_size=None, moe_shared_expert_intermediate_size=None,
    moe_layer_freq=1, moe_latent_size=None, mtp_num_layers=None, multi_latent_attention=False,
    q_lora_rank=None, kv_lora_rank=32, qk_head_dim=128, qk_pos_emb_head_dim=64, v_head_dim=128,
    attention_output_gate=False,
)
REQUIRED = ("num_layers", "hidden_size", "num_attention_heads")


def megatron_args(world_size: int, **kwargs) -> SimpleNamespace:
    """Fill Megatron's derived arguments the way ``validate_args`` does; raise ValueError on rules."""
    unknown = set(kwargs) - set(DEFAULTS) - set(REQUIRED)
    if unknown:
        raise ValueError(f"unknown Megatron arguments: {sorted(unknown)}")
    missing = [k for k in REQUIRED if kwargs.get(k) is None]
    if missing:
        raise ValueError(f"missing required Megatron arguments: {missing}")
    a = SimpleNamespace(**{**DEFAULTS, **kwargs}, world_size=world_size)
    tp, pp, cp = a.tensor_model_parallel_size, a.pipeline_model_parallel_size, a.context_parallel_size
    if world_size % (tp * pp * cp):
        raise ValueError(f"rule: world_size divisible by TP*PP*CP; {world_size} % {tp * pp * cp} != 0")
    a.data_parallel_size = world_size // (tp * pp * cp)
    # the model-parallel asserts Megatron makes at start-up (it refuses to launch otherwise)
    if a.num_attention_heads % tp:
        raise ValueError(f"rule: num_attention_heads divisible by TP; {a.num_attention_heads} % {tp} != 0")
    if a.num_query_groups is not None and a.num_query_groups % tp:
        raise ValueError(f"rule: num_query_groups divisible by TP; {a.num_query_groups} % {tp} != 0")
    if a.global_batch_size is None:
        a.global_batch_size = a.micro_batch_size * a.data_parallel_size
    if a.global_batch_size % (a.micro_batch_size * a.data_parallel_size):
        raise ValueError(f"rule: global_batch_size divisible by micro_batch_size * DP; "
                         f"{a.global_batch_size} % ({a.micro_batch_size} * {a.data_parallel_size}) != 0")
    a.num_microbatches = a.global_batch_size // (a.micro_batch_size * a.data_parallel_size)
    if a.recompute_activations:
        a.recompute_granularity = "selective"
    if tp == 1:
        a.sequence_parallel = False  # Megatron disables SP without TP
    if a.group_query_attention is None:  # Python API convenience: giving groups means GQA
        a.group_query_attention = a.num_query_groups is not None
    if a.num_query_groups is None:
        a.num_query_groups = 1  # Megatron's default for --num-query-groups
    if a.ffn_hidden_size is None:
        a.ffn_hidden_size = (int((4 * a.hidden_size * 2 / 3) / 64) * 64 if a.swiglu
                             else 4 * a.hidden_size)
    if a.kv_channels is None:
        if a.hidden_size % a.num_attention_heads:
            raise ValueError(f"rule: hidden_size divisible by num_attention_heads; "
                             f"{a.hidden_size} % {a.num_attention_heads} != 0")
        a.kv_channels = a.hidden_size // a.num_attention_heads
    if a.num_experts is not None and a.moe_ffn_hidden_size is None:
        a.moe_ffn_hidden_size = a.ffn_hidden_size
    if a.padded_vocab_size is None:
        if a.vocab_size is None:
            raise ValueError("give vocab_size (the tokenizer's) or padded_vocab_size")
        multiple = a.make_vocab_size_divisible_by * tp
        a.padded_vocab_size = math.ceil(a.vocab_size / multiple) * multiple
    # virtual pipeline size, as validate_args derives it (a size of 1 means "not interleaved")
    vpp = None
    if a.num_virtual_stages_per_pipeline_rank is not None:
        vpp = a.num_virtual_stages_per_pipeline_rank
    elif a.num_layers_per_virtual_pipeline_stage is not None:
        if a.num_layers % pp:
            raise ValueError(f"rule: num_layers divisible by PP; {a.num_layers} % {pp} != 0")
        if (a.num_layers // pp) % a.num_layers_per_virtual_pipeline_stage:
            raise ValueError(f"rule: layers per stage divisible by layers per virtual stage; "
                             f"{a.num_layers // pp} % {a.num_layers_per_virtual_pipeline_stage} != 0")
        vpp = (a.num_layers // pp) // a.num_layers_per_virtual_pipeline_stage
    a.virtual_pipeline_model_parallel_size = None if vpp == 1 else vpp
    return a


def _moe_pattern(a) -> list:
    if a.num_experts is None:
        return [0] * a.num_layers
    if isinstance(a.moe_layer_freq, int):
        return [1 if i % a.moe_layer_freq == 0 else 0 for i in range(a.num_layers)]
    pattern = list(a.moe_layer_freq)
    if len(pattern) != a.num_layers:
        raise ValueError(f"rule: moe_layer_freq pattern length equals num_layers; "
                         f"{len(pattern)} != {a.num_layers}")
    return pattern


def weight_and_optimizer_bytes(a) -> float:
    """compute_weight_and_optimizer_memory: most loaded shard (first stage) x 18 or 6 + 12/DP."""
    h, heads = a.hidden_size, a.num_attention_heads
    groups = a.num_query_groups if a.group_query_attention else heads
    gated = 3 / 2 if a.swiglu else 1
    pattern = _moe_pattern(a)
    n_moe = sum(pattern)
    n_dense = a.num_layers - n_moe
    experts = 1 if a.num_experts is None else a.num_experts
    moe_ffn = a.moe_ffn_hidden_size if a.num_experts is not None else 0
    shared = a.moe_shared_expert_intermediate_size or 0
    mtp_moe = pattern[-1] * (a.mtp_num_layers or 0)
    mtp_dense = (1 - pattern[-1]) * (a.mtp_num_layers or 0)
    norm = 1 if a.normalization == "RMSNorm" else 2
    if a.multi_latent_attention:
        q_heads = heads * (a.qk_head_dim + a.qk_pos_emb_head_dim)
        q_term = h * q_heads if a.q_lora_rank is None else a.q_lora_rank * (h + q_heads + norm)
        attn = (q_term + a.kv_lora_rank * (h + heads * (a.qk_head_dim + a.v_head_dim) + norm)
                + h * a.qk_pos_emb_head_dim + heads * a.v_head_dim * h)
    else:
        attn = 2 * h * h * ((1 + groups / heads) * (a.kv_channels * heads / h))
    dense_layer = 2 * h * (a.ffn_hidden_size * gated + norm) + attn
    moe_layer = 2 * h * (moe_ffn * experts * gated + shared * gated + norm) + attn
    embedding = h * a.padded_vocab_size
    block = dense_layer * n_dense + moe_layer * n_moe + norm * h
    mtp = dense_layer * mtp_dense + moe_layer * mtp_moe
    tp, pp = a.tensor_model_parallel_size, a.pipeline_model_parallel_size
    shard = (block / pp + mtp + embedding) / tp
    if a.untie_embeddings_and_output_weights and pp == 1:
        shard += embedding / tp
    per_param = 6 + 12 / a.data_parallel_size if a.use_distributed_optimizer else 18
    return shard * per_param


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
                    + h * a.qk_pos_emb_head_dim + heads * a.v_head_dim * h
                    + s * q_heads / 2 + s * heads * a.v_head_dim / 2)
    else:
        q = a.kv_channels * heads
        kv = a.kv_channels * groups
        gate = q if a.attention_output_gate else 0
        attn = k * (h * (q + 2 * kv + gate) + q * s / 2 * 2 + q * h)
    if a.moe_latent_size is None:
        routed = moe_ffn * topk * ffn_x
    else:
        routed = moe_ffn * topk * ffn_x * a.moe_latent_size / h + 2 * a.moe_latent_size
    mlp = k * h * (a.ffn_hidden_size * ffn_x * n_dense + routed * n_moe + shared * ffn_x * n_moe)
    mtp_extra = k * mtp * (3 * h + 2 * h * h)
    logits = k * h * a.padded_vocab_size * (mtp + 1)
    return b * s * (mlp + attn * n_layers + mtp_extra + logits)


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
            "data_parallel_size": a.data_parallel_size, "num_microbatches": a.num_microbatches,
            "padded_vocab_size": a.padded_vocab_size,
            "activation_formula": ("with SP (selective recompute)" if a.sequence_parallel
                                   and a.recompute_granularity == "selective" else "without SP"),
            "report": (f"Theoretical memory footprints: weight and optimizer={w / mb:.2f} MB, "
                       f"activation={act / mb:.2f} MB, total={(w + act) / mb:.2f} MB")}

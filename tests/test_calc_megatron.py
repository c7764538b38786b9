"""labkit.calc.megatron_estimate reproduces current Megatron-LM's estimate to the byte.

Expected values are derived BY HAND below from NVIDIA/Megatron-LM at commit d98e8a64:
``compute_weight_and_optimizer_memory`` / ``compute_activation_memory[_without_sp]`` in
megatron/training/theoretical_memory_usage.py and ``num_floating_point_operations`` in
megatron/training/training.py. Each case writes the parameter count of every storage class
(TP-sharded / TP-replicated / expert) as a closed form, never by calling the code under test.
Exact equality where the arithmetic is exact in binary floating point; otherwise rel=1e-12 (a
different evaluation order than Megatron's expression).

Change from the formulas labkit followed before (theoretical_memory_usage.py @ 00caa53a): norms,
the router and the shared-expert gate are no longer divided by TP, and routed experts are divided
by EP x ETP with their optimizer state over the expert-data-parallel size. GPT-3 175B on TP 8
therefore grows from 10282.77 MB to 10284.62 MB: the LayerNorms (weight and bias) of the stage's
layers are held whole by each TP rank.

Also checked once outside CI against Megatron itself (its parse_args + validate_args, then
compute_weight_and_optimizer_memory, compute_activation_memory[_without_sp] and
num_floating_point_operations, imported from a checkout of d98e8a64): identical floats for every
layout below; it refuses what this file expects refused.
"""
import pytest

from labkit.calc import megatron_estimate
from labkit.calc.megatron import megatron_args, weight_breakdown

REL = 1e-12


def est(world, **kw):
    return megatron_estimate(world_size=world, **kw)


def test_gpt3_175b_sp_selective_distributed_optimizer():
    # TP 8, PP 16 -> DP 8; 1536 / (1 * 8) = 192 microbatches; LayerNorm (weight + bias).
    e = est(1024, num_layers=96, hidden_size=12288, num_attention_heads=96, seq_length=2048,
            vocab_size=51200, micro_batch_size=1, global_batch_size=1536,
            tensor_model_parallel_size=8, pipeline_model_parallel_size=16, sequence_parallel=True,
            recompute_granularity="selective", use_distributed_optimizer=True)
    h, L, s, V = 12288, 96, 2048, 51200           # 51200 is a multiple of 128*8: no padding
    tp_sharded = (L * 12 * h * h / 16 + h * V) / 8  # attention 4h^2 + MLP 8h^2; first stage
    replicated = (L * 2 * 2 * h + 2 * h) / 16        # two LayerNorms per layer + final, whole
    assert (tp_sharded, replicated) == (1437597696, 296448)
    assert e["weight_and_optimizer_bytes"] == (tp_sharded + replicated) * (6 + 12 / 8) == 10784206080
    act = s * 1 * h * (18 + 4 * 4) * L + 8 * s * 1 * 16 + s * 1 * h * 16   # layers, embedding
    assert e["activation_bytes"] == act / 8 == 10318020608   # PP>1: no output layer; m >= PP
    per_token = L * (72 * h * h + 6 * h * s) + 6 * h * V    # 6 = 3 passes x 2 FLOPs per MAC
    assert e["flops_per_iteration"] == pytest.approx(1536 * s * per_token, rel=REL)
    assert (e["data_parallel_size"], e["num_microbatches"]) == (8, 192)
    assert "weight and optimizer=10284.62 MB, activation=9840.03 MB" in e["report"]


def test_llama_style_gqa_swiglu_untied_rmsnorm_tp2():
    # 8 GPUs, TP 2 -> DP 4; 8 KV groups of 32 heads, SwiGLU, RMSNorm (no bias), untied; 18 B/param.
    h, L, s, ffn, V = 4096, 32, 4096, 14336, 128256   # 128256 = 501 * 256: no padding at TP 2
    e = est(8, num_layers=L, hidden_size=h, num_attention_heads=32, group_query_attention=True,
            num_query_groups=8, ffn_hidden_size=ffn, swiglu=True, normalization="RMSNorm",
            seq_length=s, vocab_size=V, untie_embeddings_and_output_weights=True,
            micro_batch_size=1, global_batch_size=8, tensor_model_parallel_size=2)
    tp_sharded = (L * (2.5 * h * h + 3 * h * ffn) + h * V) / 2 + h * V / 2   # + output layer
    replicated = L * 2 * h + h
    assert e["weight_and_optimizer_bytes"] == (tp_sharded + replicated) * 18 == 72274747392
    act = s * h * (10 + 24 / 2) * L + 8 * s + s * h + (s * V / 2 + s * h) * 2
    assert e["activation_bytes"] == pytest.approx(act * 1.05, rel=REL)
    q, kv = 4096, 1024
    per_token = L * (6 * (h * (q + 2 * kv) + q * s + q * h) + 6 * h * ffn * 3) + 6 * h * V
    assert e["flops_per_iteration"] == 8 * s * per_token == 1581029001265152
    assert e["activation_formula"] == "without SP"


def test_moe_ep_etp_expert_dp_shared_gate_router_bias_vpp():
    # 16 GPUs: TP 2, PP 2 -> DP 4; experts on ETP 1 x EP 4 -> expert-DP 16 / (1*4*2) = 2.
    # Layers 0, 2 are MoE (8 experts, top-2, ffn 128, shared expert 64 with its gate); VPP 2.
    e = est(16, num_layers=4, hidden_size=64, num_attention_heads=4, group_query_attention=True,
            num_query_groups=2, ffn_hidden_size=256, swiglu=True, seq_length=128, vocab_size=1000,
            num_experts=8, moe_router_topk=2, moe_ffn_hidden_size=128,
            moe_shared_expert_intermediate_size=64, moe_shared_expert_gate=True, moe_layer_freq=2,
            tensor_model_parallel_size=2, pipeline_model_parallel_size=2,
            expert_model_parallel_size=4, expert_tensor_parallel_size=1,
            num_layers_per_virtual_pipeline_stage=1, micro_batch_size=2, global_batch_size=16,
            sequence_parallel=True, recompute_granularity="selective", use_distributed_optimizer=True)
    assert e["padded_vocab_size"] == 1024                    # 1000 -> multiple of 128 * 2
    attn, dense, shared = 2 * 64 * 64 * 1.5, 2 * 64 * 256 * 1.5, 2 * 64 * 64 * 1.5
    routed = 2 * 64 * 128 * 8 * 1.5
    norms, router, gate = 2 * 64 * 2, 64 * 8 + 8, 64         # router weight + bias (add_bias_linear)
    tp_sharded = ((attn + dense) * 2 + (attn + shared) * 2) / 2 / 2 + 64 * 1024 / 2
    replicated = (norms * 2 + (norms + router + gate) * 2 + 2 * 64) / 2
    expert = routed * 2 / 2 / (1 * 4)
    assert (tp_sharded, replicated, expert) == (75776, 1160, 49152)
    assert e["weight_and_optimizer_bytes"] == ((tp_sharded + replicated) * (6 + 12 / 4)
                                               + expert * (6 + 12 / 2)) == 1282248
    act = 128 * 2 * 64 * (18 + 4 * 256 / 64) * 4 + 8 * 128 * 2 * 2 + 128 * 2 * 64 * 2
    assert e["activation_bytes"] == act * (1 + 1 / (2 * 2)) / 2 == 1415680
    attn_f, core_f = 6 * (64 * (64 + 2 * 32) + 64 * 64), 6 * 64 * 128
    mlp_f = 6 * 64 * (256 * 3 * 2 + (128 * 2 * 3 + 64 * 3) * 2)
    assert e["flops_per_iteration"] == 16 * 128 * (mlp_f + 4 * (attn_f + core_f) + 6 * 64 * 1024)


def test_mixtral_8x7b_like_tp2_ep8_etp1_expert_dp():
    # Mixtral-8x7B dimensions on 64 GPUs: TP 2 -> DP 32; experts on EP 8 x ETP 1 -> expert-DP
    # 64 / 8 = 8. All 32 layers MoE (8 experts, top-2, ffn 14336), RMSNorm, untied, no linear bias.
    h, L, s, V, ffn = 4096, 32, 4096, 32000, 14336              # 32000 = 125 * 256: no padding
    e = est(64, num_layers=L, hidden_size=h, num_attention_heads=32, group_query_attention=True,
            num_query_groups=8, ffn_hidden_size=ffn, swiglu=True, normalization="RMSNorm",
            seq_length=s, vocab_size=V, untie_embeddings_and_output_weights=True, num_experts=8,
            moe_router_topk=2, add_bias_linear=False, tensor_model_parallel_size=2,
            expert_model_parallel_size=8, expert_tensor_parallel_size=1, micro_batch_size=1,
            global_batch_size=32, use_distributed_optimizer=True)
    attn, routed = 2 * h * h * (1 + 8 / 32), 2 * h * ffn * 8 * 1.5
    tp_sharded = (attn * L + h * V) / 2 + h * V / 2
    replicated = (2 * h + h * 8) * L + h                         # RMSNorms + router (no bias), final
    expert = routed * L / (1 * 8)
    assert (tp_sharded, replicated, expert) == (802160640, 1314816, 5637144576)
    w = (tp_sharded + replicated) * (6 + 12 / 32) + expert * (6 + 12 / 8)
    assert e["weight_and_optimizer_bytes"] == w == 47400740352
    # the formula labkit followed before: every parameter / TP, experts' optimizer over DP
    old = ((attn + routed + 2 * h + h * 8) * L + h + h * V) / 2 + h * V / 2
    assert old * (6 + 12 / 32) / w == pytest.approx(3.1406, abs=1e-4)   # was 3.1x too high
    act = s * h * (10 + 24 / 2) * L + 8 * s + s * h + (s * V / 2 + s * h) * 2
    assert e["activation_bytes"] == pytest.approx(act * 1.05, rel=REL)
    per_token = L * (6 * (h * (h + 2 * 1024) + h * h) + 6 * h * s + 6 * h * ffn * 2 * 3) + 6 * h * V
    assert e["flops_per_iteration"] == 32 * s * per_token


def test_dense_tp4_replicated_layernorms():
    # 4 GPUs, TP 4: the four LayerNorm vectors of each layer are whole on every TP rank.
    h, s = 256, 512
    e = est(4, num_layers=2, hidden_size=h, num_attention_heads=8, seq_length=s, vocab_size=50257,
            micro_batch_size=1, tensor_model_parallel_size=4)
    V = 50688                                                  # 50257 -> multiple of 128 * 4
    tp_sharded, replicated = (2 * 12 * h * h + h * V) / 4, 2 * 4 * h + 2 * h
    assert e["params_on_most_loaded_shard"]["replicated"] == replicated == 2560
    assert e["weight_and_optimizer_bytes"] == (tp_sharded + replicated) * 18 == 65516544
    act = s * h * (10 + 24 / 4) * 2 + 8 * s + s * h + (s * V / 4 + s * h) * 2
    assert e["activation_bytes"] == pytest.approx(act * 1.05, rel=REL)
    assert e["flops_per_iteration"] == s * (2 * (72 * h * h + 6 * h * s) + 6 * h * V)


def test_fewer_microbatches_than_stages_and_tied_embedding():
    # PP 4 with 2 microbatches: activations scaled by min(1, 2/4); TP 1; no distributed optimizer.
    h, s, V = 256, 512, 50304                                  # 50257 padded to a multiple of 128
    e = est(4, num_layers=8, hidden_size=h, num_attention_heads=8, seq_length=s, vocab_size=50257,
            micro_batch_size=4, global_batch_size=8, pipeline_model_parallel_size=4)
    tp_sharded, replicated = 8 * 12 * h * h / 4 + h * V, (8 * 4 * h + 2 * h) / 4
    assert e["weight_and_optimizer_bytes"] == (tp_sharded + replicated) * 18
    act = s * 4 * h * (10 + 24) * 8 + 8 * s * 4 * 4 + s * 4 * h * 4
    assert e["activation_bytes"] == pytest.approx(act * 0.5 * 1.05, rel=REL)
    assert e["flops_per_iteration"] == 8 * s * (8 * (72 * h * h + 6 * h * s) + 6 * h * V)


def test_virtual_stages_per_rank_interleaving_penalty():
    # PP 4 x TP 2 on 8 GPUs (DP 1), 8 layers, 2 virtual stages per rank; m = 4.
    h, s, V = 128, 256, 512
    kw = dict(num_layers=8, hidden_size=h, num_attention_heads=4, seq_length=s, vocab_size=V,
              micro_batch_size=1, global_batch_size=4, tensor_model_parallel_size=2,
              pipeline_model_parallel_size=4)
    e = est(8, num_virtual_stages_per_pipeline_rank=2, **kw)
    assert e == est(8, num_layers_per_virtual_pipeline_stage=1, **kw)   # same v = (8/4)/1
    assert e == est(8, virtual_pipeline_model_parallel_size=2, **kw)    # the name Megatron derives
    assert e["weight_and_optimizer_bytes"] == ((8 * 12 * h * h / 4 + h * V) / 2
                                               + (8 * 4 * h + 2 * h) / 4) * 18
    act = s * h * (10 + 24 / 2) * 8 + 8 * s * 4 + s * h * 4
    assert e["activation_bytes"] == pytest.approx(act * (1 + 3 / (4 * 2)) * 1.05, rel=REL)
    assert e["flops_per_iteration"] == 4 * s * (8 * (72 * h * h + 6 * h * s) + 6 * h * V)


def test_multi_latent_attention_q_lora_and_mtp_tp2():
    # MLA with q LoRA 32, kv LoRA 16, qk head 8 + RoPE 4, v head 8; one MTP layer; RMSNorm; TP 2.
    e = est(2, num_layers=2, hidden_size=64, num_attention_heads=4, ffn_hidden_size=256,
            seq_length=32, vocab_size=128, micro_batch_size=1, normalization="RMSNorm",
            position_embedding_type="rope", multi_latent_attention=True, q_lora_rank=32,
            kv_lora_rank=16, qk_head_dim=8, qk_pos_emb_head_dim=4, v_head_dim=8, mtp_num_layers=1,
            tensor_model_parallel_size=2)
    q_term = 32 * (64 + 4 * (8 + 4) + 1)                              # q LoRA + q norm (RMS: 1)
    attn = q_term + 16 * (64 + 4 * (8 + 8) + 1) + 64 * 4 + 4 * 8 * 64   # kv LoRA + norm, rope, o
    assert (q_term, attn) == (3616, 7984)
    layer = attn + 2 * 64 * 256
    tp_sharded = (2 * layer + layer + 64 * 256) / 2                   # block + MTP + embedding
    replicated = 2 * 2 * 64 + 64 + 2 * 64                             # norms, final, MTP norms
    assert e["weight_and_optimizer_bytes"] == (tp_sharded + replicated) * 18 == 69768 * 18
    core = 6 * (4 * 12 / 2 + 4 * 8 / 2) * 32                          # per token per layer
    per_token = (6 * 64 * 256 * 2 * 3 + 3 * (6 * attn + core) + 6 * (3 * 64 + 2 * 64 * 64)
                 + 6 * 64 * 256 * 2)
    assert e["flops_per_iteration"] == 32 * per_token
    act = 32 * 64 * (10 + 24 / 2) * 2 + 8 * 32 + 32 * 64 + (32 * 256 / 2 + 32 * 64) * 2
    assert e["activation_bytes"] == pytest.approx(act * 1.05, rel=REL)


def test_moe_latent_attention_output_gate_no_bias():
    # 4 GPUs, EP 4 (ETP 1) -> expert-DP 1; MoE latent 16; gated attention output (FLOPs only).
    e = est(4, num_layers=2, hidden_size=64, num_attention_heads=4, seq_length=64, vocab_size=256,
            micro_batch_size=1, num_experts=4, moe_router_topk=1, moe_ffn_hidden_size=32,
            moe_latent_size=16, moe_shared_expert_intermediate_size=32, attention_output_gate=True,
            add_bias_linear=False, expert_model_parallel_size=4, use_distributed_optimizer=True)
    tp_sharded = (2 * 64 * 64 * 2 + 2 * 64 * 32) * 2 + 64 * 256        # attention, shared, emb.
    replicated = (2 * 64 * 2 + 2 * 64 * 16 + 64 * 4) * 2 + 2 * 64     # norms, latent proj, router
    expert = 2 * 16 * 32 * 4 * 2 / 4                                  # experts run on width 16
    assert e["weight_and_optimizer_bytes"] == ((tp_sharded + replicated) * (6 + 12 / 4)
                                               + expert * (6 + 12 / 1)) == 600192
    routed = 32 * 1 * 2 * 16 / 64 + 2 * 16
    per_token = (6 * 64 * (routed + 32 * 2) * 2 + 2 * (6 * (64 * (64 * 3 + 64) + 64 * 64)
                                                       + 6 * 64 * 64) + 6 * 64 * 256)
    assert e["flops_per_iteration"] == 4 * 64 * per_token
    act = 64 * 64 * (10 + 24) * 2 + 8 * 64 + 64 * 64 + (64 * 256 + 64 * 64) * 2
    assert e["activation_bytes"] == pytest.approx(act * 1.05, rel=REL)


def test_context_parallel_folds_into_dp_and_is_ignored_by_activations():
    # 8 GPUs: TP 2, CP 2 -> DP 2; SP + selective; distributed optimizer over DP 2.
    h, s, V = 128, 256, 1024
    e = est(8, num_layers=2, hidden_size=h, num_attention_heads=4, seq_length=s, vocab_size=1000,
            micro_batch_size=1, global_batch_size=4, tensor_model_parallel_size=2,
            context_parallel_size=2, sequence_parallel=True, recompute_granularity="selective",
            use_distributed_optimizer=True)
    assert (e["data_parallel_size"], e["num_microbatches"]) == (2, 2)
    w = ((2 * 12 * h * h + h * V) / 2 + 2 * 4 * h + 2 * h) * (6 + 12 / 2)
    assert e["weight_and_optimizer_bytes"] == w
    act = s * h * (18 + 16) * 2 + 8 * s + s * h + s * h * 4 * (1 + V / h)
    assert e["activation_bytes"] == act / 2
    assert e["flops_per_iteration"] == 4 * s * (2 * (72 * h * h + 6 * h * s) + 6 * h * V)


def test_moe_layer_pattern_with_moe_mtp_layer():
    # Pattern [0,1,0,1]: the last layer is MoE, so the MTP layer is too. 2 GPUs, EP 2 -> expert-DP 1.
    e = est(2, num_layers=4, hidden_size=64, num_attention_heads=4, seq_length=32, vocab_size=256,
            micro_batch_size=1, num_experts=2, moe_router_topk=1, moe_ffn_hidden_size=64,
            moe_layer_freq=[0, 1, 0, 1], mtp_num_layers=1, position_embedding_type="rope",
            expert_model_parallel_size=2)
    attn, dense, routed, norms, router = 2 * 64 * 64 * 2, 2 * 64 * 256, 2 * 64 * 64 * 2, 256, 130
    tp_sharded = (attn + dense) * 2 + attn * 2 + attn + 64 * 256
    replicated = norms * 2 + (norms + router) * 2 + 2 * 64 + norms + router
    expert = (routed * 2 + routed) / 2
    assert e["weight_and_optimizer_bytes"] == (tp_sharded + replicated + expert) * 18 == 190214 * 18
    per_token = (6 * 64 * (256 * 2 * 2 + 64 * 1 * 2 * 3) + 5 * (6 * (64 * 192 + 64 * 64) + 6 * 64 * 32)
                 + 6 * (3 * 64 + 2 * 64 * 64) + 6 * 64 * 256 * 2)
    assert e["flops_per_iteration"] == 2 * 32 * per_token
    act = 32 * 64 * (10 + 24) * 4 + 8 * 32 + 32 * 64 + (32 * 256 + 32 * 64) * 2   # MTP not counted
    assert e["activation_bytes"] == pytest.approx(act * 1.05, rel=REL)


def test_megatron_fsdp_v1_uses_the_distributed_optimizer_and_unpadded_vocab():
    kw = dict(num_layers=2, hidden_size=64, num_attention_heads=4, seq_length=32, vocab_size=1000,
              micro_batch_size=1)
    fsdp = est(4, use_megatron_fsdp=True, pad_vocab_size=False, **kw)
    assert fsdp["padded_vocab_size"] == 1000                   # --no-pad-vocab-size
    w = (2 * 12 * 64 * 64 + 64 * 1000 + 2 * 4 * 64 + 2 * 64) * (6 + 12 / 4)
    assert fsdp["weight_and_optimizer_bytes"] == w
    act = 32 * 64 * (10 + 24) * 2 + 8 * 32 + 32 * 64 + (32 * 1000 + 32 * 64) * 2
    assert fsdp["activation_bytes"] == pytest.approx(act * 1.05, rel=REL)
    assert fsdp["flops_per_iteration"] == 4 * 32 * (2 * (72 * 64 * 64 + 6 * 64 * 32) + 6 * 64 * 1000)


def test_breakdown_names_the_expert_data_parallel_size():
    a = megatron_args(16, num_layers=2, hidden_size=64, num_attention_heads=4, seq_length=32,
                      vocab_size=256, micro_batch_size=1, num_experts=4,
                      tensor_model_parallel_size=2, expert_model_parallel_size=2)
    w = weight_breakdown(a)
    assert a.expert_tensor_parallel_size == 2                 # defaults to TP, as validate_args
    assert (w["data_parallel_size"], w["expert_data_parallel_size"]) == (8, 4)


def test_sequence_parallel_without_tp_is_turned_off_like_megatron():
    kw = dict(num_layers=2, hidden_size=64, num_attention_heads=4, seq_length=64, vocab_size=256,
              micro_batch_size=1, recompute_granularity="selective")
    on = est(2, sequence_parallel=True, **kw)
    off = est(2, sequence_parallel=False, **kw)
    assert on["activation_formula"] == "without SP"
    assert on["weight_and_optimizer_bytes"] == off["weight_and_optimizer_bytes"]
    assert any("sequence_parallel turned off" in n for n in on["notes"])


def test_recompute_activations_means_selective():
    kw = dict(num_layers=2, hidden_size=64, num_attention_heads=4, seq_length=64, vocab_size=256,
              micro_batch_size=1, tensor_model_parallel_size=2, sequence_parallel=True)
    assert (est(2, recompute_activations=True, **kw)
            == est(2, recompute_granularity="selective", **kw))


def test_num_query_groups_counts_only_with_the_gqa_flag_like_megatron():
    kw = dict(num_layers=2, hidden_size=64, num_attention_heads=8, seq_length=32, vocab_size=256,
              micro_batch_size=1)
    mha = est(1, **kw)
    ignored = est(1, num_query_groups=2, **kw)
    gqa = est(1, num_query_groups=2, group_query_attention=True, **kw)
    assert ignored["weight_and_optimizer_bytes"] == mha["weight_and_optimizer_bytes"]
    assert any("ignored without group_query_attention" in n for n in ignored["notes"])
    assert gqa["weight_and_optimizer_bytes"] < mha["weight_and_optimizer_bytes"]


BASE = dict(num_layers=4, hidden_size=64, num_attention_heads=4, vocab_size=256, seq_length=64,
            micro_batch_size=1)


@pytest.mark.parametrize("bad, message", [
    (dict(world_size=6, tensor_model_parallel_size=4), r"TP\*PP\*CP"),
    (dict(world_size=8, global_batch_size=12), r"divisible by micro_batch_size \* DP"),
    (dict(world_size=8, pipeline_model_parallel_size=2, num_layers_per_virtual_pipeline_stage=3),
     "virtual"),
    (dict(world_size=4, num_layers=6, pipeline_model_parallel_size=4), "num_layers divisible by PP"),
    (dict(world_size=2, seq_length=130, context_parallel_size=2), r"seq_length divisible by 2\*CP"),
    (dict(world_size=8, tensor_model_parallel_sise=2), "did you mean tensor_model_parallel_size"),
    (dict(world_size=1, bogus_flag=1), "bogus_flag is not a Megatron-LM argument"),
    (dict(world_size=1, checkpoint_activations=True), "--checkpoint-activations is no longer valid"),
    (dict(world_size=1, batch_size=4), "use --micro-batch-size instead"),
    (dict(world_size=1, multi_latent_attention=True, group_query_attention=True),
     "mutually exclusive"),
    (dict(world_size=1, mtp_num_layers=1), "not supported with learned_absolute"),
    (dict(world_size=1, moe_latent_size=8), "only for MoE models"),
    (dict(world_size=1, max_position_embeddings=32), r"must be greater than or equal to seq_length"),
    (dict(world_size=1, hybrid_layer_pattern="M*M*"), "not covered"),
    (dict(world_size=1, normalization="BatchNorm"), "must be one of"),
    (dict(world_size=1, num_experts=4, moe_layer_freq=[1, 0]), "Invalid length of moe_layer_pattern"),
    (dict(world_size=1, seq_length=None), "missing required Megatron arguments"),
    (dict(world_size=8, num_experts=4, expert_model_parallel_size=8), "num_experts divisible by EP"),
    (dict(world_size=1, num_experts=4, expert_tensor_parallel_size=0), "integer >= 1, got 0"),
    (dict(world_size=1, micro_batch_size=0), "micro_batch_size must be an integer >= 1"),
    (dict(world_size=1, num_layers_per_virtual_pipeline_stage=1, num_virtual_stages_per_pipeline_rank=2),
     "No more than one of"),
    (dict(world_size=1, step_batch_size_schedule="0:8", global_batch_size=8), "Cannot specify both"),
])
def test_refusals_name_the_argument_or_the_rule(bad, message):
    kw = {**BASE, **bad}
    with pytest.raises(ValueError, match=message):
        est(kw.pop("world_size"), **kw)


def test_real_arguments_the_estimate_does_not_read_are_accepted():
    plain = est(8, **BASE)
    assert est(8, lr=6e-5, bf16=True, data_path=["x_text_document"], attention_backend="auto",
               experimental_attention_variant="dsa", overlap_p2p_comm=True, **BASE) == plain


def test_heads_not_divisible_by_tp_is_refused_like_megatron():
    # GPT-2 XL has 25 heads: Megatron raises at start-up, so the estimate must not answer.
    with pytest.raises(ValueError, match="num_attention_heads divisible by TP; 25 % 2 != 0"):
        est(8, num_layers=48, hidden_size=1600, num_attention_heads=25, seq_length=1024,
            vocab_size=50257, micro_batch_size=1, tensor_model_parallel_size=2)


def test_expert_grid_must_divide_the_world_like_megatron():
    with pytest.raises(ValueError):  # 8 % (2*8*1) != 0: Megatron raises RuntimeError
        est(8, **{**BASE, "num_experts": 8, "expert_model_parallel_size": 8,
                  "expert_tensor_parallel_size": 2})


SMALL = dict(num_layers=2, hidden_size=64, num_attention_heads=4, vocab_size=256, seq_length=32,
             micro_batch_size=1)


def test_query_groups_dividing_tp_are_accepted_like_megatron():
    e = est(4, **SMALL, group_query_attention=True, num_query_groups=2, tensor_model_parallel_size=4)
    tp_sharded = (2 * (2 * 64 * 64 * 1.5 + 2 * 64 * 256) + 64 * 512) / 4   # vocab padded to 512
    assert e["weight_and_optimizer_bytes"] == (tp_sharded + 2 * 256 + 128) * 18 == 564480


def test_expert_parallel_over_tp_ranks_with_etp1_is_accepted_like_megatron():
    e = est(8, **SMALL, num_experts=8, tensor_model_parallel_size=2, expert_model_parallel_size=8,
            expert_tensor_parallel_size=1)
    tp_sharded = (2 * 2 * 64 * 64 * 2 + 64 * 256) / 2
    replicated = (256 + 64 * 8 + 8) * 2 + 128
    expert = 2 * (2 * 64 * 256 * 8) / (1 * 8)                 # expert-DP 8 / 8 = 1; 18 B/param
    assert e["weight_and_optimizer_bytes"] == (tp_sharded + replicated + expert) * 18 == 1652256

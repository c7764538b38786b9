"""labkit.calc.megatron_estimate reproduces Megatron-LM's estimate to the byte.

Expected values are derived BY HAND below from the formulas of Megatron-LM
(megatron/training/theoretical_memory_usage.py @ 00caa53a, num_floating_point_operations in
megatron/training/training.py @ 001b00c2), in closed form per configuration, not by calling the
code under test. Exact float equality is asserted where the arithmetic is exact in binary
floating point; otherwise rel=1e-12 (one or two roundings of a different evaluation order).
"""
import math
import subprocess
import sys

import pytest

from labkit.calc import megatron_estimate

REL = 1e-12  # float64, different evaluation order than Megatron's expression


def test_gpt3_175b_sp_selective_distributed_optimizer():
    # GPT-3 175B on 1024 GPUs: TP 8, PP 16 -> DP 8; 1536 / (1 * 8) = 192 microbatches.
    e = megatron_estimate(world_size=1024, num_layers=96, hidden_size=12288, num_attention_heads=96,
                          seq_length=2048, vocab_size=51200, micro_batch_size=1,
                          global_batch_size=1536, tensor_model_parallel_size=8,
                          pipeline_model_parallel_size=16, sequence_parallel=True,
                          recompute_granularity="selective", use_distributed_optimizer=True)
    h, L, s, V = 12288, 96, 2048, 51200            # 51200 is a multiple of 128*8: no padding
    layer = 2 * h * (4 * h + 2) + 2 * h * h * 2    # MLP + 2 LayerNorms, attention (no GQA)
    block = L * layer + 2 * h                      # + final LayerNorm
    shard = (block / 16 + h * V) / 8               # most loaded: first stage, with embeddings
    assert shard == 1437634752
    assert e["weight_and_optimizer_bytes"] == shard * (6 + 12 / 8) == 10782260640
    act = s * 1 * h * (18 + 4 * 4) * L + 8 * s * 1 * 16 + s * 1 * h * 16   # layers, embedding
    assert e["activation_bytes"] == act / 8 == 10318020608   # PP>1: no output layer; m >= PP
    per_token = L * (72 * h * h + 6 * h * s) + 6 * h * V    # 6 = 3 passes x 2 FLOPs per MAC
    assert e["flops_per_iteration"] == pytest.approx(1536 * s * per_token, rel=REL)
    assert (e["data_parallel_size"], e["num_microbatches"]) == (8, 192)
    assert "weight and optimizer=10282.77 MB, activation=9840.03 MB" in e["report"]


def test_llama_style_gqa_swiglu_untied_no_sp():
    # 8 GPUs, TP 2, PP 1 -> DP 4; GQA (8 groups of 32 heads), SwiGLU, RMSNorm, untied, 18 B/param.
    h, L, s, ffn, V = 4096, 32, 4096, 14336, 128256   # 128256 = 501 * 256: no padding at TP 2
    e = megatron_estimate(world_size=8, num_layers=L, hidden_size=h, num_attention_heads=32,
                          group_query_attention=True, num_query_groups=8, ffn_hidden_size=ffn,
                          swiglu=True, normalization="RMSNorm", seq_length=s, vocab_size=V,
                          untie_embeddings_and_output_weights=True, micro_batch_size=1,
                          global_batch_size=8, tensor_model_parallel_size=2)
    layer = 2 * h * (ffn * 3 // 2 + 1) + 2 * h * h * (1 + 8 / 32)   # = 218112000
    assert layer == 218112000
    block = L * layer + h
    shard = (block + h * V) / 2 + h * V / 2          # untied and PP 1: the output layer too
    assert e["weight_and_optimizer_bytes"] == shard * 18 == 72272351232
    act = s * h * (10 + 24 / 2) * L + 8 * s + s * h  # formula without SP
    act += (s * V / 2 + s * h) * 2                   # logits + final norm output, 2 bytes
    assert e["activation_bytes"] == pytest.approx(act * 1.05, rel=REL)
    q, kv = 4096, 1024
    per_token = L * (6 * (h * (q + 2 * kv) + q * s + q * h) + 6 * h * ffn * 3) + 6 * h * V
    assert e["flops_per_iteration"] == 8 * s * per_token == 1581029001265152
    assert e["activation_formula"] == "without SP"


def test_moe_shared_experts_interleaved_pipeline():
    # MoE every 2nd layer (4 experts, top-2, expert ffn 128, shared expert 64), GQA 4 heads/2
    # groups, SwiGLU, VPP v = (4/2)/1 = 2, SP + selective, distributed optimizer over DP 2.
    e = megatron_estimate(world_size=8, num_layers=4, hidden_size=64, num_attention_heads=4,
                          num_query_groups=2, ffn_hidden_size=256, swiglu=True, seq_length=128,
                          vocab_size=1000, num_experts=4, moe_router_topk=2, moe_ffn_hidden_size=128,
                          moe_shared_expert_intermediate_size=64, moe_layer_freq=2,
                          tensor_model_parallel_size=2, pipeline_model_parallel_size=2,
                          num_layers_per_virtual_pipeline_stage=1, micro_batch_size=2,
                          global_batch_size=8, sequence_parallel=True,
                          recompute_granularity="selective", use_distributed_optimizer=True)
    # vocab 1000 padded to a multiple of 128 * 2 = 256 -> 1024
    assert e["padded_vocab_size"] == 1024
    attn = 2 * 64 * 64 * 1.5                                # (1 + 2/4) * 1
    dense = 2 * 64 * (256 * 1.5 + 2) + attn                 # 61696
    moe = 2 * 64 * (128 * 4 * 1.5 + 64 * 1.5 + 2) + attn    # 123136
    assert (dense, moe) == (61696, 123136)
    block = 2 * dense + 2 * moe + 2 * 64                    # layers 0, 2 are MoE
    shard = (block / 2 + 64 * 1024) / 2                     # 125216
    assert e["weight_and_optimizer_bytes"] == shard * (6 + 12 / 2) == 1502592
    act = 128 * 2 * 64 * (18 + 4 * 256 / 64) * 4 + 8 * 128 * 2 * 2 + 128 * 2 * 64 * 2
    act *= 1 + (2 - 1) / (2 * 2)                            # interleaving penalty, v = 2
    assert e["activation_bytes"] == act / 2 == 1415680
    q, kv = 64, 32
    attn_f = 6 * (64 * (q + 2 * kv) + q * 128 + q * 64)     # per token per layer
    mlp_f = 6 * 64 * (256 * 3 * 2 + 128 * 2 * 3 * 2 + 64 * 3 * 2)
    per_token = mlp_f + 4 * attn_f + 6 * 64 * 1024
    assert e["flops_per_iteration"] == 8 * 128 * per_token == 2264924160
    assert e["num_microbatches"] == 2


def test_fewer_microbatches_than_stages_and_tied_embedding_copy():
    # PP 4 with 2 microbatches: activations scaled by min(1, 2/4); no distributed optimizer.
    h, s = 256, 512
    e = megatron_estimate(world_size=4, num_layers=8, hidden_size=h, num_attention_heads=8,
                          seq_length=s, vocab_size=50257, micro_batch_size=4, global_batch_size=8,
                          pipeline_model_parallel_size=4)
    V = 50304                                  # 50257 padded to a multiple of 128
    block = 8 * (2 * h * (4 * h + 2) + 4 * h * h) + 2 * h
    assert e["weight_and_optimizer_bytes"] == (block / 4 + h * V) * 18
    act = s * 4 * h * (10 + 24) * 8 + 8 * s * 4 * 4 + s * 4 * h * 4
    assert e["activation_bytes"] == pytest.approx(act * 0.5 * 1.05, rel=REL)


def test_sequence_parallel_without_tp_is_turned_off_like_megatron():
    kw = dict(world_size=2, num_layers=2, hidden_size=64, num_attention_heads=4, seq_length=64,
              vocab_size=256, micro_batch_size=1, recompute_granularity="selective")
    assert (megatron_estimate(sequence_parallel=True, **kw)
            == megatron_estimate(sequence_parallel=False, **kw))
    assert megatron_estimate(sequence_parallel=True, **kw)["activation_formula"] == "without SP"


def test_virtual_size_one_is_not_interleaved():
    kw = dict(world_size=4, num_layers=8, hidden_size=64, num_attention_heads=4, seq_length=64,
              vocab_size=256, micro_batch_size=1, global_batch_size=8, pipeline_model_parallel_size=4)
    assert (megatron_estimate(num_layers_per_virtual_pipeline_stage=2, **kw)
            == megatron_estimate(**kw))


@pytest.mark.parametrize("bad, rule", [
    (dict(world_size=6, tensor_model_parallel_size=4), r"TP\*PP\*CP"),
    (dict(world_size=8, global_batch_size=12, micro_batch_size=1), r"divisible by micro_batch_size \* DP"),
    (dict(world_size=8, pipeline_model_parallel_size=2, num_layers_per_virtual_pipeline_stage=3), "virtual"),
    (dict(world_size=8, bogus_flag=1), "unknown Megatron arguments"),
])
def test_bad_arguments_name_the_rule(bad, rule):
    kw = dict(num_layers=4, hidden_size=64, num_attention_heads=4, vocab_size=256)
    with pytest.raises(ValueError, match=rule):
        megatron_estimate(**{**kw, **bad})


def test_cli_prints_megatron_line_and_ignores_other_flags():
    flags = ["--world-size", "1024", "--num-layers", "96", "--hidden-size", "12288",
             "--num-attention-heads", "96", "--seq-length", "2048", "--vocab-size", "51200",
             "--micro-batch-size", "1", "--global-batch-size", "1536",
             "--tensor-model-parallel-size", "8", "--pipeline-model-parallel-size", "16",
             "--sequence-parallel", "--recompute-activations", "--use-distributed-optimizer",
             "--lr", "6e-5", "--bf16"]
    out = subprocess.run([sys.executable, "-m", "labkit", "estimate", *flags], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "Theoretical memory footprints: weight and optimizer=10282.77 MB, activation=9840.03 MB, " \
           "total=20122.80 MB" in out.stdout
    assert "--lr --bf16" in out.stdout


def test_cli_bad_layout_is_an_error_message_not_a_traceback():
    from labkit.calc.cli import main
    rc = main(["--world-size", "6", "--num-layers", "4", "--hidden-size", "64",
               "--num-attention-heads", "4", "--vocab-size", "256", "--tensor-model-parallel-size", "4"])
    assert rc == 2


def test_cli_num_query_groups_needs_the_gqa_flag_like_megatron(capsys):
    from labkit.calc.cli import main
    base = ["--world-size", "1", "--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "8",
            "--vocab-size", "256", "--num-query-groups", "2", "--json"]
    outputs = []
    for extra in ([], ["--group-query-attention"]):
        assert main(base + extra) == 0
        outputs.append(capsys.readouterr().out)
    mha = megatron_estimate(world_size=1, num_layers=2, hidden_size=64, num_attention_heads=8, vocab_size=256)
    assert str(mha["weight_and_optimizer_bytes"]) in outputs[0]       # groups ignored without the flag
    assert str(mha["weight_and_optimizer_bytes"]) not in outputs[1]


def test_cli_moe_layer_freq_list_pattern():
    from labkit.calc.cli import _freq
    assert _freq("([1]*3+[0]*1)*2") == [1, 1, 1, 0, 1, 1, 1, 0]
    assert _freq("2") == 2
    with pytest.raises(ValueError):
        _freq("__import__('os')")


def test_multi_latent_attention_and_mtp_by_hand():
    # MLA (no q LoRA): kv_lora_rank 16, qk head 8 + rope 4, v head 8; one MTP layer; RMSNorm.
    e = megatron_estimate(world_size=1, num_layers=2, hidden_size=64, num_attention_heads=4,
                          ffn_hidden_size=256, seq_length=32, vocab_size=128, normalization="RMSNorm",
                          multi_latent_attention=True, kv_lora_rank=16, qk_head_dim=8,
                          qk_pos_emb_head_dim=4, v_head_dim=8, mtp_num_layers=1)
    q_term = 64 * 4 * (8 + 4)                                        # 3072
    attn = q_term + 16 * (64 + 4 * (8 + 8) + 1) + 64 * 4 + 4 * 8 * 64   # 7440
    layer = 2 * 64 * (256 + 1) + attn                                # 40336
    shard = (2 * layer + 64) + layer + 64 * 128                      # block + MTP + embedding
    assert (attn, layer, shard) == (7440, 40336, 129264)
    assert e["weight_and_optimizer_bytes"] == shard * 18
    attn_f = 6 * (q_term + 16 * (64 + 4 * 16 + 1) + 64 * 4 + 4 * 8 * 64 + 32 * 4 * 12 / 2 + 32 * 4 * 8 / 2)
    per_token = 6 * 64 * 256 * 2 * 3 + 3 * attn_f + 6 * (3 * 64 + 2 * 64 * 64) + 6 * 64 * 128 * 2
    assert per_token == 895392
    assert e["flops_per_iteration"] == 32 * per_token


def test_megatron_refuses_heads_not_divisible_by_tp_like_megatron_does():
    # GPT-2 XL has 25 heads: Megatron asserts at start-up, so the estimate must not answer.
    with pytest.raises(ValueError, match="num_attention_heads divisible by TP; 25 % 2 != 0"):
        megatron_estimate(world_size=8, num_layers=48, hidden_size=1600, num_attention_heads=25,
                          seq_length=1024, vocab_size=50257, micro_batch_size=1,
                          tensor_model_parallel_size=2)


def test_cli_takes_the_vocabulary_from_a_gpt2_vocab_file(capsys):
    from labkit.calc import cli
    flags = ["--world-size", "8", "--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
             "--seq-length", "32", "--micro-batch-size", "1"]
    assert cli.main(flags) == 2 and "--vocab-size" in capsys.readouterr().err
    assert cli.main(flags + ["--vocab-file", "gpt2-vocab.json"]) == 0
    out = capsys.readouterr().out
    assert "vocab size 50257" in out and "padded vocab size: 50304" in out

"""labkit.calc on hand-checked cases: rules, batch math, communication, bubbles, memory, params."""
import math

import pytest

import labkit.calc as c
from labkit.calc import ModelConfig, ParallelConfig

TINY = ModelConfig(num_layers=4, hidden_size=64, num_attention_heads=4, seq_length=32,
                   vocab_size=256, make_vocab_size_divisible_by=1)


# ----------------------------------------------------------------------------- rules
@pytest.mark.parametrize("model_kw, par_kw, rule", [
    ({}, dict(world_size=6, tensor_model_parallel_size=4), r"world_size divisible by TP\*PP\*CP; 6"),
    ({}, dict(world_size=3, tensor_model_parallel_size=3), "num_attention_heads divisible by TP; 4 % 3"),
    (dict(hidden_size=96, num_attention_heads=12, kv_channels=8, num_query_groups=3),
     dict(world_size=4, tensor_model_parallel_size=4), "num_query_groups a multiple or a divisor of TP; 3 and 4"),
    ({}, dict(world_size=3, pipeline_model_parallel_size=3), "num_layers divisible by PP; 4 % 3"),
    (dict(num_layers=8), dict(world_size=2, pipeline_model_parallel_size=2,
                              num_layers_per_virtual_pipeline_stage=3), "per virtual stage; 4 % 3"),
    ({}, dict(world_size=1, num_layers_per_virtual_pipeline_stage=2), "needs PP > 1"),
    ({}, dict(world_size=4, micro_batch_size=2, global_batch_size=12), r"micro_batch_size \* DP; 12"),
    (dict(num_layers=8), dict(world_size=2, pipeline_model_parallel_size=2, micro_batch_size=1,
                              global_batch_size=3, num_layers_per_virtual_pipeline_stage=2),
     "num_microbatches divisible by PP; 3 % 2"),
    (dict(seq_length=30), dict(world_size=4, context_parallel_size=4), r"seq_length divisible by 2\*CP; 30 % 8"),
    (dict(num_experts=6), dict(world_size=4, expert_model_parallel_size=4), "num_experts divisible by EP; 6 % 4"),
    ({}, dict(world_size=2, expert_model_parallel_size=2), "needs num_experts"),
    (dict(ffn_hidden_size=250), dict(world_size=4, tensor_model_parallel_size=4), "ffn_hidden_size divisible by TP"),
])
def test_each_rule_is_a_value_error_with_the_numbers(model_kw, par_kw, rule):
    with pytest.raises(ValueError, match=rule):
        c.validate(TINY.with_(**model_kw), ParallelConfig(**par_kw))


def test_bad_field_values_are_value_errors():
    with pytest.raises(ValueError, match="positive integer"):
        ParallelConfig(world_size=0)
    with pytest.raises(ValueError, match="recompute_granularity"):
        ParallelConfig(recompute_granularity="some")
    with pytest.raises(ValueError, match="divisible by num_attention_heads"):
        ModelConfig(num_layers=2, hidden_size=65, num_attention_heads=4)


def test_sp_without_tp_is_a_warning_not_an_error():
    warnings = c.validate(TINY, ParallelConfig(world_size=2, sequence_parallel=True))
    assert warnings == ["sequence_parallel with TP=1 is a no-op (Megatron turns it off)"]


def test_megatron_defaults_are_filled():
    m = ModelConfig(num_layers=2, hidden_size=4096, num_attention_heads=32, swiglu=True)
    assert m.ffn_hidden_size == 10880       # int(4*4096*2/3 / 64) * 64 = 170 * 64
    assert m.kv_channels == 128
    assert ModelConfig(2, 64, 4, vocab_size=50257).padded_vocab_size(tp=2) == 50432  # 197 * 256


# ----------------------------------------------------------------------------- batch
def test_batch_math_worked_example():
    # Megatron's batch rule: 4 GPUs of pure DP, micro batch 16, global batch 2048 -> 32 accumulation steps
    b = c.batch_math(TINY, ParallelConfig(world_size=4, micro_batch_size=16, global_batch_size=2048))
    assert (b["data_parallel_size"], b["num_microbatches"], b["gradient_accumulation_steps"]) == (4, 32, 32)
    assert b["tokens_per_step"] == 2048 * 32
    b = c.batch_math(TINY, ParallelConfig(world_size=16, tensor_model_parallel_size=2,
                                          pipeline_model_parallel_size=4, micro_batch_size=2))
    assert (b["data_parallel_size"], b["global_batch_size"], b["num_microbatches"]) == (2, 4, 1)


# ----------------------------------------------------------------------------- communication
def test_collective_bytes_by_hand():
    assert c.ring_all_reduce_bytes(1000, 4) == 1500.0          # 2 * 3/4 * 1000
    assert c.all_gather_bytes(1000, 4) == c.reduce_scatter_bytes(1000, 4) == 750.0
    assert c.all_to_all_bytes(800, 8) == 700.0
    assert c.ring_all_reduce_bytes(1000, 1) == 0.0
    with pytest.raises(ValueError):
        c.all_gather_bytes(10, 0)


def test_dp_step_bytes_by_stage():
    assert c.dp_step_bytes(400, 4) == {"all_reduce": 600.0}
    assert c.dp_step_bytes(400, 4, 1) == c.dp_step_bytes(400, 4, 2) == {"reduce_scatter": 300.0, "all_gather": 300.0}
    assert c.dp_step_bytes(400, 4, 3) == {"reduce_scatter": 300.0, "all_gather": 600.0}
    assert c.dp_step_bytes(400, 4, 1, grad_bytes=800) == {"reduce_scatter": 600.0, "all_gather": 300.0}
    # gradient accumulation over m microbatches: stages 0 and 1 still sync once, 2 and 3 per microbatch
    assert c.dp_step_bytes(400, 4, 0, num_microbatches=3) == {"all_reduce": 600.0}
    assert c.dp_step_bytes(400, 4, 1, num_microbatches=3) == {"reduce_scatter": 300.0, "all_gather": 300.0}
    assert c.dp_step_bytes(400, 4, 2, num_microbatches=3) == {"reduce_scatter": 900.0, "all_gather": 300.0}
    assert c.dp_step_bytes(400, 4, 3, num_microbatches=3) == {"reduce_scatter": 900.0, "all_gather": 1800.0}
    with pytest.raises(ValueError, match="zero_stage"):
        c.dp_step_bytes(400, 4, 4)


def test_tp_and_sp_layer_bytes():
    n = 8 * 2 * 16 * 4                                         # s*b*h*4 bytes = 1024
    assert c.tp_layer_bytes(8, 2, 16, 2) == {"all_reduce": 4 * 2 * 0.5 * n}
    sp = c.tp_layer_bytes(8, 2, 16, 4, sequence_parallel=True)
    assert sp == {"all_gather": 4 * 0.75 * n, "reduce_scatter": 4 * 0.75 * n}
    assert sum(sp.values()) == sum(c.tp_layer_bytes(8, 2, 16, 4).values())   # same bytes as TP


def test_pp_step_bytes_plain_and_interleaved():
    n = 8 * 1 * 16 * 2
    assert c.pp_step_bytes(8, 1, 16, 6, 4, 0, 2) == {"send_forward": 6 * n, "send_backward": 0.0}
    assert c.pp_step_bytes(8, 1, 16, 6, 4, 3, 2) == {"send_forward": 0.0, "send_backward": 6 * n}
    assert c.pp_step_bytes(8, 1, 16, 6, 4, 1, 2) == {"send_forward": 6 * n, "send_backward": 6 * n}
    # v = 2: rank 0 holds chunks 0 and 4 of 8; chunk 0 sends only forward, chunk 4 both ways
    assert c.pp_step_bytes(8, 1, 16, 6, 4, 0, 2, 2) == {"send_forward": 12 * n, "send_backward": 6 * n}
    with pytest.raises(ValueError, match="stage"):
        c.pp_step_bytes(8, 1, 16, 6, 4, 4)


def test_cp_and_ep_bytes_and_alpha_beta():
    assert c.comm.cp_layer_bytes(16, 1, 8, 2, 2) == {"send_recv": 3 * 1 * 2 * 8 * 1 * 8 * 2}
    assert c.comm.ep_layer_bytes(4, 1, 8, 4, 2, 2) == {"all_to_all": 4 * 0.75 * 4 * 2 * 8 * 2}
    assert c.comm.alpha_beta_time(1e9, 1e10, 1e-5, 3) == pytest.approx(0.1 + 3e-5)
    # ring all-reduce of 1 GB over 4 ranks at 100 GB/s: 1.5 GB sent, 6 hops of 5 us
    assert c.comm.collective_time("all_reduce", 1e9, 4, 100e9, 5e-6) == pytest.approx(0.015 + 30e-6)


# ----------------------------------------------------------------------------- pipeline
def test_bubble_fraction():
    assert c.bubble_fraction(4, 8) == 3 / 8
    assert c.bubble_fraction(4, 8, 2) == 3 / 16
    assert c.bubble_fraction(1, 1) == 0.0
    with pytest.raises(ValueError, match="m must be"):
        c.bubble_fraction(4, 0)


# ----------------------------------------------------------------------------- memory
def test_zero_memory_per_rank_by_hand():
    assert c.zero_memory_per_rank(100, 4, 0) == {"params": 400, "grads": 400, "optimizer": 800}
    assert c.zero_memory_per_rank(100, 4, 1) == {"params": 400, "grads": 400, "optimizer": 200}
    assert c.zero_memory_per_rank(100, 4, 2) == {"params": 400, "grads": 100, "optimizer": 200}
    assert c.zero_memory_per_rank(100, 4, 3) == {"params": 100, "grads": 100, "optimizer": 200}
    # padding: 10 params over 4 ranks -> shards of ceil(10/4) = 3
    assert c.zero_memory_per_rank(10, 4, 3, 2, 2, 12) == {"params": 6, "grads": 6, "optimizer": 36}
    # Megatron's distributed optimizer: 2 + 4 + 12/dp bytes per parameter
    z = c.zero_memory_per_rank(1000, 8, 1, 2, 4, 12)
    assert sum(z.values()) == 1000 * (6 + 12 / 8)


@pytest.mark.parametrize("d", [1, 2, 8])
def test_bytes_per_param_megatron_table_and_labkit(d):
    """Megatron's own table (docs/user-guide/features/dist_optimizer.md, d98e8a64): fp16 20 and
    4 + 16/d (its fp16 optimizer steps on an fp32 copy of main_grad), bf16 18 and 6 + 12/d, fp32 16
    and 8 + 8/d; labkit's fp16 makes no lasting copy: 16 and 4 + 12/d."""
    table = {c.MEGATRON_FP16: (20, 4 + 16 / d), c.MIXED_18: (18, 6 + 12 / d), c.FP32: (16, 8 + 8 / d),
             c.LABKIT_FP16: (16, 4 + 12 / d)}
    for prec, (plain, dist) in table.items():
        assert prec.bytes_per_param == prec.state_bytes_per_param(d) == plain, prec.name
        assert prec.state_bytes_per_param(d, distributed_optimizer=True) == pytest.approx(dist), prec.name
    # memory_per_stage shards the fp32 copy with the optimizer: a 1-stage run holds the table's bytes
    model = c.model("gpt2-774m")
    par = c.ParallelConfig(world_size=d, use_distributed_optimizer=True)
    (row,) = c.memory_per_stage(model, par, c.MEGATRON_FP16)
    n = row["num_params"]
    assert row["params"] + row["grads"] == 4 * n and row["optimizer"] == 16 * -(-n // d)


def test_korthikanti_activations_table2():
    s, b, h, a = 2048, 1, 12288, 96
    sbh = s * b * h
    assert c.activation_bytes_per_layer(s, b, h, a) == sbh * (34 + 5 * a * s / h)
    assert c.activation_bytes_per_layer(s, b, h, a, tp=8) == sbh * (10 + 24 / 8 + 5 * a * s / (h * 8))
    assert c.activation_bytes_per_layer(s, b, h, a, 8, True) == sbh * (34 / 8 + 5 * a * s / (h * 8))
    assert c.activation_bytes_per_layer(s, b, h, a, 8, True, "selective") == sbh * 34 / 8
    assert c.activation_bytes_per_layer(s, b, h, a, 8, True, "full") == 2 * sbh / 8
    assert c.activation_bytes_per_layer(s, b, h, a, 8, False, "full") == 2 * sbh


@pytest.mark.parametrize("tp, sp, rec", [(1, False, None), (4, False, None), (4, True, None),
                                          (4, True, "selective"), (2, False, "full")])
def test_general_activation_formula_reduces_to_korthikanti(tp, sp, rec):
    m = ModelConfig(num_layers=2, hidden_size=256, num_attention_heads=8, seq_length=128)
    par = ParallelConfig(world_size=tp, tensor_model_parallel_size=tp, sequence_parallel=sp,
                         micro_batch_size=2, recompute_granularity=rec)
    assert c.layer_activation_bytes(m, par, 2, dropout=True, attention="math") == pytest.approx(
        c.activation_bytes_per_layer(128, 2, 256, 8, tp, sp, rec), rel=1e-15)


def test_memory_per_stage_by_hand():
    # 2 stages x TP 1, DP 2 with ZeRO-1, fp32 (4 + 4 + 8), no dropout, 4 microbatches
    par = ParallelConfig(world_size=4, pipeline_model_parallel_size=2, micro_batch_size=2,
                         global_batch_size=16, zero_stage=1)
    rows = c.memory_per_stage(TINY, par, c.FP32, dropout=False, attention="math")
    layer = 2 * 128 + (64 * 192 + 192) + (64 * 64 + 64) + (64 * 256 + 256) + (256 * 64 + 64)
    first = 2 * layer + 256 * 64 + 32 * 64              # + word and position embeddings
    last = 2 * layer + 128 + 256 * 64                    # + final norm + tied copy of the embedding
    assert [r["num_params"] for r in rows] == [first, last]
    assert rows[0]["params"] == 4 * first and rows[0]["optimizer"] == 8 * math.ceil(first / 2)
    # per layer per microbatch (fp32, no dropout): s*b*(4h + 2q + 2kv + f + f)*4 + a*s*s*b*4
    per_layer = 32 * 2 * (4 * 64 + 2 * 64 + 2 * 64 + 256 + 256) * 4 + 4 * 32 * 32 * 2 * 4
    assert rows[0]["activations"] == 2 * per_layer * 2                 # stage 0: 2 in flight
    assert rows[1]["activations"] == 2 * per_layer * 1 + 32 * 2 * (2 * 64 * 4 + 256 * 4)  # + head


def test_interleaved_first_stage_matches_megatron_penalty():
    m = TINY.with_(num_layers=8)
    par = ParallelConfig(world_size=4, pipeline_model_parallel_size=4, micro_batch_size=1,
                         global_batch_size=8, num_layers_per_virtual_pipeline_stage=1)
    from labkit.calc.memory import in_flight_microbatches
    assert in_flight_microbatches(m, par, 0) == 4 * (1 + 3 / (4 * 2))
    assert in_flight_microbatches(m, par.with_(num_layers_per_virtual_pipeline_stage=None), 0) == 4


# ----------------------------------------------------------------------------- params and FLOPs
@pytest.mark.parametrize("name, expected", [
    ("gpt2-774m", 774_030_080),     # Hugging Face gpt2-large
    ("gpt2-1.5b", 1_557_611_200),   # Hugging Face gpt2-xl
])
def test_gpt2_parameter_counts_match_published(name, expected):
    m = c.model(name).with_(make_vocab_size_divisible_by=1)   # GPT-2's vocab is not padded
    assert c.total_params(m) == expected


def test_llama_and_mixtral_parameter_counts_match_published():
    assert c.total_params(c.model("llama3-8b")) == 8_030_261_248            # Meta Llama 3 8B
    assert c.total_params(c.model("mixtral-8x7b")) == 46_702_792_704        # Mixtral 8x7B
    assert c.active_params(c.model("mixtral-8x7b")) == 12_879_925_248


def test_paper_flops_equation_and_mfu():
    m = c.model("gpt3-175b")
    B, s, l, h, V = 1536, 2048, 96, 12288, 51200
    assert c.paper_flops_per_iteration(m, B) == pytest.approx(
        96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h)), rel=1e-12)
    par = ParallelConfig(world_size=1024, tensor_model_parallel_size=8,
                         pipeline_model_parallel_size=16, global_batch_size=B)
    f = c.model_flops_per_iteration(m, par)
    assert c.mfu(m, par, 10.0, 312e12) == pytest.approx(f / (10 * 1024 * 312e12))
    with pytest.raises(ValueError):
        c.utilization(1.0, 0.0, 1, 1.0)


# ----------------------------------------------------------------------------- perf and planner
def test_step_time_parts_add_up_and_tp1_has_no_tp_comm():
    m = c.model("megatron-1.7b")
    par = ParallelConfig(world_size=32, micro_batch_size=16, global_batch_size=512,
                         recompute_granularity="full")
    r = c.step_time(m, par, c.cluster("dgx-a100", 4))
    assert r["tp_comm"] == r["pp_comm"] == r["bubble"] == 0.0
    assert r["step_time"] == pytest.approx(r["compute"] + r["dp_comm"] + r["optimizer"] + r["fixed"])
    with pytest.raises(ValueError, match="world_size equals the cluster"):
        c.step_time(m, par, c.cluster("dgx-a100", 2))


def test_planner_prefers_tp_inside_a_node():
    result = c.plan(c.model("megatron-18b"), c.cluster("dgx-a100", 4), 256,
                    micro_batch_sizes=(1, 2), recompute=("selective",))
    best = result["ranked"][0]
    assert best["tp"] <= 8 and result["ranked"]
    assert all(r["peak_memory_gib"] * 2 ** 30 <= result["capacity"] for r in result["ranked"])
    assert c.explain(result, c.cluster("dgx-a100", 4))[0].startswith("winner")

"""Sequence parallelism (labkit/tensor_parallel/sequence_parallel.py and the SP paths of the TP plan).

Chapter "Sequence parallelism" (Korthikanti et al. 2022). Parity with the dense layer in float64
(atol 1e-12, rtol 1e-10), the bytes of the all-gathers and reduce-scatters against
labkit.calc.comm, saved activations against labkit's itemized count and, through the itemized
gaps, against Korthikanti's formula (labkit.calc.memory.activation_bytes_per_layer), and training
losses against the single-device reference (float32, atol 5e-6).
"""
from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

import labkit
from labkit.calc import comm as calc_comm
from labkit.calc.comm import tp_layer_bytes
from labkit.calc.memory import activation_bytes_per_layer
from labkit.config import TrainConfig
from labkit.measure.activations import korthikanti_gaps, labkit_layer_activation_bytes
from labkit.measure.tensor_parallel import block_parity
from labkit.reference import train_reference
from labkit.tensor_parallel.sequence_parallel import sequence_range

F64 = dict(atol=1e-12, rtol=1e-10)
S, B, H, A = 16, 2, 32, 4


@pytest.fixture(scope="module")
def blocks():
    return {tp: block_parity(tp, sequence_parallel=True) for tp in (1, 2, 4)}


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_sp_block_output_input_grad_and_every_weight_grad_equal_dense(blocks, tp):
    for r, res in enumerate(blocks[tp]):
        assert len(res["pairs"]) == 2 + 12
        got_out = res["pairs"]["output"][0]
        assert got_out.shape == (B, S // tp, H)   # the layer's output is this rank's sequence shard
        for what, (got, expected) in res["pairs"].items():
            assert_close(got, expected, **F64, msg=lambda m: f"tp {tp}, rank {r}, {what}: {m}")


@pytest.mark.parametrize("tp", [2, 4])
def test_sp_bytes_are_all_gathers_and_reduce_scatters_of_tp_volume(blocks, tp):
    sp = tp_layer_bytes(S, B, H, tp, bytes_per_element=8, sequence_parallel=True)
    plain = tp_layer_bytes(S, B, H, tp, bytes_per_element=8)
    assert sum(sp.values()) == pytest.approx(sum(plain.values()))   # same volume as TP
    for res in blocks[tp]:
        assert set(res["comm"]) == {"all_gather", "reduce_scatter"}
        for op in ("all_gather", "reduce_scatter"):
            assert res["comm"][op]["calls"] == 4                      # 2 forward, 2 backward
            assert res["comm"][op]["bytes"] == pytest.approx(sp[op], rel=1e-12)


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_sp_saved_activations_equal_the_itemized_count(blocks, tp):
    expected = sum(labkit_layer_activation_bytes(S, B, H, A, tp, True, bytes_per_element=8).values())
    for res in blocks[tp]:
        assert res["saved_bytes"] == expected, res["saved"]


@pytest.mark.parametrize("tp", [2, 4, 8])
@pytest.mark.parametrize("sp", [False, True])
def test_itemized_gaps_account_exactly_for_korthikanti(tp, sp):
    for s, b, h, a in [(S, B, H, A), (1024, 64, 1280, 20)]:   # the lab's layer, GPT-2 large
        ours = sum(labkit_layer_activation_bytes(s, b, h, a, tp, sp, bytes_per_element=2).values())
        gaps = sum(korthikanti_gaps(s, b, h, a, tp, sp).values())
        assert ours + gaps == pytest.approx(activation_bytes_per_layer(s, b, h, a, tp, sp), rel=1e-12)


def test_sp_saves_less_than_tp_and_the_difference_matches_the_h200_measurement():
    # measured on 2xH200 (data/h200x2_gpt2large_strategies.csv): TP2 85969 MiB, TP2+SP 71571 MiB
    s, b, h, a, layers = 1024, 64, 1280, 20, 36
    saved = layers * (activation_bytes_per_layer(s, b, h, a, 2) - activation_bytes_per_layer(s, b, h, a, 2, True))
    assert saved / 2**20 == pytest.approx(85969 - 71571, rel=0.01)   # 14400 vs 14398 MiB


def test_sequence_range_and_rule():
    assert [sequence_range(16, r, 4) for r in range(4)] == [(0, 4), (4, 8), (8, 12), (12, 16)]
    with pytest.raises(ValueError, match="seq_length 30 is not divisible by tensor_model_parallel_size 4"):
        sequence_range(30, 0, 4)
    with pytest.raises(ValueError, match=r"rule: with sequence_parallel, seq_length / CP divisible by TP.*30 / 1 % 4 != 0"):
        TrainConfig(seq_length=30, tensor_model_parallel_size=4, sequence_parallel=True).validate(4)


def test_the_tp_plan_sums_over_tp_what_sp_feeds_sequence_shards():
    """The one rule (the TP plan, from labkit.roles): under SP the norms and the row-parallel biases
    (Megatron tags both ``sequence_parallel``) get partial gradients, summed over tp; without SP
    nothing but a per-head QK-layernorm, whose heads are cut. The tags follow the plan.
    One layer cut for tp rank 0 of 2 (a stand-in group: no processes)."""
    from types import SimpleNamespace

    from labkit import shard_plan as sp
    from labkit.model import GPTConfig, TransformerLayer
    from labkit.tensor_parallel.plan import apply_plan, tp_plan
    norms = {f"{ln}.{w}" for ln in ("input_layernorm", "pre_mlp_layernorm") for w in ("weight", "bias")}
    biases = {"self_attention.linear_proj.bias", "mlp.linear_fc2.bias"}
    qk = {f"self_attention.{q}_layernorm.{w}" for q in "qk" for w in ("weight", "bias")}
    for qk_layernorm, sequence_parallel, want in ((False, False, set()), (False, True, norms | biases),
                                                  (True, False, qk), (True, True, norms | biases | qk)):
        layer = TransformerLayer(GPTConfig(qk_layernorm=qk_layernorm))
        plan = sp.initial(layer)
        apply_plan(layer, tp_plan(sequence_parallel), SimpleNamespace(size=2, rank=0), plan)
        summed = {n for n, e in plan.items() if "tp" in e.sum_axes()}
        tagged = {n for n, p in layer.named_parameters() if getattr(p, "sequence_parallel", False)}
        assert summed == tagged == want, (qk_layernorm, sequence_parallel, summed ^ want, tagged ^ want)


TRAIN = dict(micro_batch_size=2, global_batch_size=4, hidden_size=32, seq_length=32, num_layers=2)


@pytest.mark.parametrize("tp, world_size", [(2, 2), (4, 4), (2, 4)])
def test_sp_train_losses_equal_single_device_over_5_steps(tp, world_size):
    result = labkit.train(world_size=world_size, steps=5, seed=0, log_interval=0,
                          tensor_model_parallel_size=tp, sequence_parallel=True, **TRAIN)
    reference = train_reference(world_size=world_size, steps=5, seed=0, tensor_model_parallel_size=tp,
                                sequence_parallel=True, **TRAIN)
    assert_close(torch.tensor(result.losses), torch.tensor(reference), atol=5e-6, rtol=0)
    assert "reduce_scatter" in result.ranks[0]["comm"]["tp"]   # SP really ran


@pytest.mark.parametrize("tp", [2, 4])
def test_regather_variant_equals_dense_saves_the_gathered_inputs_and_pays_two_all_gathers(tp):
    """Advanced variant (use_regather): Megatron's memory-saving SP GEMM, with its own parity test."""
    ranks = block_parity(tp, sequence_parallel=True, regather=True)
    sp = tp_layer_bytes(S, B, H, tp, bytes_per_element=8, sequence_parallel=True)
    extra = 2 * calc_comm.all_gather_bytes(S * B * H * 8, tp)   # one re-gather per column GEMM
    expected_saved = sum(labkit_layer_activation_bytes(S, B, H, A, tp, True, 8, regather=True).values())
    for r, res in enumerate(ranks):
        for what, (got, expected) in res["pairs"].items():
            assert_close(got, expected, **F64, msg=lambda m: f"tp {tp}, rank {r}, {what}: {m}")
        assert res["comm"]["all_gather"]["calls"] == 6
        assert res["comm"]["all_gather"]["bytes"] == pytest.approx(sp["all_gather"] + extra, rel=1e-12)
        assert res["comm"]["reduce_scatter"]["bytes"] == pytest.approx(sp["reduce_scatter"], rel=1e-12)
        assert res["saved_bytes"] == expected_saved
    ours = sum(labkit_layer_activation_bytes(S, B, H, A, tp, True, 2, regather=True).values())
    gaps = sum(korthikanti_gaps(S, B, H, A, tp, True, regather=True).values())
    assert ours + gaps == pytest.approx(activation_bytes_per_layer(S, B, H, A, tp, True), rel=1e-12)

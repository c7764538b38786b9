"""What ``implementation="megatron"`` refuses, before any process starts (labkit/megatron/options.py):
each refusal a named rule, and MoE now runs (issue 30). Pure Python: megatron-core need not be
installed (the rules are checked before it is imported)."""
from __future__ import annotations

import pytest

from labkit.config import train_config
from labkit.megatron.options import RULES, check_megatron, refusals

MOE = dict(hidden_size=32, num_attention_heads=4, seq_length=16, global_batch_size=8, num_layers=2,
           num_experts=4, moe_router_topk=2)


def rules(world: int, **config) -> list[str]:
    return [rule for rule, _ in refusals(train_config(**config), world)]


def test_moe_runs_through_megatron_without_linear_biases():
    assert rules(2, **MOE, add_bias_linear=False, expert_model_parallel_size=2) == []
    assert rules(2, **MOE, add_bias_linear=False, tensor_model_parallel_size=2, sequence_parallel=True) == []
    assert rules(1, **MOE, add_bias_linear=False, moe_expert_capacity_factor=1.0) == []


def test_moe_with_biases_is_refused_only_where_megatrons_inplace_bias_bug_fires():
    """The bug (tests/test_megatron.py's reproducer) needs expert-TP 1 and EP 1: no explicit expert
    communication, so the RowParallelLinear output is a view the in-place bias add may not touch."""
    assert rules(1, **MOE) == ["moe_bias", "moe_router_bias"]
    assert rules(2, **MOE, expert_model_parallel_size=2) == ["moe_router_bias"]


def test_moe_with_biases_is_refused_because_megatrons_router_has_a_bias_and_labkits_has_not():
    """Found by labkit fuzz --implementation megatron (seed 2026): EP 2 with biases passed every
    other rule, then Megatron's model had a parameter labkit's has not (decoder.layers.0.mlp.router.bias)."""
    assert rules(2, **MOE, expert_model_parallel_size=2) == ["moe_router_bias"]
    assert "moe/router.py" in RULES["moe_router_bias"]
    assert rules(2, **MOE, expert_model_parallel_size=2, add_bias_linear=False) == []


def test_moe_biases_with_expert_tp_are_refused_as_megatron_asserts():
    """Found by the fuzzer: TransformerConfig asserts ETP == 1 whenever MoE has linear biases."""
    assert rules(2, **MOE, tensor_model_parallel_size=2, sequence_parallel=True) == ["moe_router_bias", "moe_bias_etp"]
    assert rules(4, **MOE, tensor_model_parallel_size=2, sequence_parallel=True,
                 expert_tensor_parallel_size=1, expert_model_parallel_size=2) == ["moe_router_bias"]


def test_position_dropping_is_refused_by_name():
    assert rules(2, **MOE, add_bias_linear=False, expert_model_parallel_size=2,
                 moe_expert_capacity_factor=1.0, moe_token_drop_policy="position") == ["moe_drop"]


def test_top1_routing_needs_the_softmax_first_as_megatron_says():
    """Found by the fuzzer (seed 1): Megatron's TransformerConfig raises at build time for top-1
    routing with the softmax after the top-k; labkit now refuses it before any process starts."""
    one = dict(MOE, add_bias_linear=False, expert_model_parallel_size=2, moe_router_topk=1)
    assert rules(2, **one) == ["moe_topk1"]
    assert rules(2, **one, moe_router_pre_softmax=True) == []


def test_experts_without_ep_and_with_their_own_tp_are_refused_for_megatrons_bug():
    """Megatron-Core 0.16.1 reduces such experts' gradients over DP only (tests/test_megatron.py)."""
    one = dict(MOE, add_bias_linear=False, tensor_model_parallel_size=2, sequence_parallel=True)
    assert rules(2, **one, expert_tensor_parallel_size=1) == ["moe_etp_ep1"]
    assert rules(2, **one) == [] and rules(4, **one, expert_tensor_parallel_size=1, expert_model_parallel_size=2) == []


def test_shared_experts_with_biases_are_refused_as_megatron_asserts():
    shared = dict(MOE, expert_model_parallel_size=2, moe_shared_expert_intermediate_size=32)
    assert rules(2, **shared) == ["moe_router_bias", "moe_shared_bias"]
    assert rules(2, **shared, add_bias_linear=False) == []


def test_every_rule_is_named_in_the_error():
    dense = {k: v for k, v in MOE.items() if k not in ("num_experts", "moe_router_topk")}
    cfg = train_config(**dense, context_parallel_size=2, bf16=True)
    with pytest.raises(ValueError) as err:
        check_megatron(cfg, 2)
    for rule in ("cp", "precision"):
        assert f"[{rule}] {RULES[rule]}" in str(err.value)

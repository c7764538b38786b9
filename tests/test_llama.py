"""Tier 2 (gloo ranks): the Llama family (RMSNorm, SwiGLU, RoPE, GQA, no bias, untied) under every axis.

Issue "labkit v3 and the Llama family". Each layout trains the tiny Llama-3-shaped preset 5 steps with
``labkit.train`` and is compared with ``labkit.reference`` (one device, whole batch, plain AdamW):
the losses of all 5 steps, the gradient norms, and every parameter's gradient after step 1,
reassembled under the dense names from the shard plans. float64: only the order of additions
differs, so 1e-12 on gradients, 1e-11 on losses and norms (as tests/test_composition.py).

The two traps of version 2 each have a test that fails on them, with a negative control that
shows the test can see them: an RMSNorm whose gradient is not summed over tp under SP, and a
SwiGLU fc1 = [gate; up] cut contiguously instead of rank r holding [gate_r; up_r].
"""
from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

import labkit
from labkit.reference import train_reference
from labkit.spec import preset_args

LLAMA = dict(preset_args("llama3-tiny"), params_dtype="float64", micro_batch_size=2, global_batch_size=8)
GRAD = dict(rtol=1e-12, atol=1e-12)

LAYOUTS = {  # name: (world size, layout)
    "1 device": (1, {}),
    "tp2 sp": (2, dict(tensor_model_parallel_size=2, sequence_parallel=True)),
    "tp4, 2 query groups (replicated K/V)": (4, dict(tensor_model_parallel_size=4)),
    "cp2": (2, dict(context_parallel_size=2)),
    "pp2 vpp2": (2, dict(pipeline_model_parallel_size=2, num_layers_per_virtual_pipeline_stage=1)),
    "ep2, SwiGLU experts": (2, dict(expert_model_parallel_size=2, num_experts=4, moe_router_topk=2, num_layers=2)),
    "dp2 zero3": (2, dict(zero_stage=3)),
    "tp2 sp x cp2": (4, dict(tensor_model_parallel_size=2, sequence_parallel=True, context_parallel_size=2)),
    "tp2 x pp2 x dp2, sp, distributed optimizer": (8, dict(tensor_model_parallel_size=2, sequence_parallel=True,
                                                           pipeline_model_parallel_size=2,
                                                           use_distributed_optimizer=True)),
}


@pytest.fixture(scope="module", params=list(LAYOUTS))
def trained(request):
    world, layout = LAYOUTS[request.param]
    kw = dict(LLAMA, **layout)
    res = labkit.train(world_size=world, steps=5, log_interval=0, capture_grads=True, **kw)
    ref = train_reference(world_size=world, steps=5, capture_grads=True, **kw)
    return request.param, res, ref


def test_losses_and_norms_equal_one_device(trained):
    name, res, ref = trained
    assert_close(torch.tensor(res.losses), torch.tensor(ref["losses"]), rtol=0, atol=1e-11, msg=name)
    assert_close(torch.tensor(res.grad_norms), torch.tensor(ref["grad_norms"]), rtol=1e-11, atol=0, msg=name)


def test_every_gradient_equals_one_device(trained):
    name, res, ref = trained
    assert set(res.grads) == set(ref["grads"]), name
    for pname, g in ref["grads"].items():
        assert_close(res.grads[pname], g, **GRAD, msg=lambda m: f"{name}, {pname}: {m}")


def test_a_new_family_from_existing_roles_needs_no_strategy_change():
    """StarCoder2-shaped (LayerNorm with biases, GeLU, RoPE, GQA with qkv biases): only a spec.
    TP4 with 2 query groups cuts the qkv BIAS like its weight, K/V replicated and summed."""
    kw = dict(LLAMA, normalization="LayerNorm", swiglu=False, add_bias_linear=True,
              tensor_model_parallel_size=4, sequence_parallel=True)
    res = labkit.train(world_size=4, steps=3, log_interval=0, capture_grads=True, **kw)
    ref = train_reference(world_size=4, steps=3, capture_grads=True, **kw)
    assert_close(torch.tensor(res.losses), torch.tensor(ref["losses"]), rtol=0, atol=1e-11)
    assert "decoder.layers.0.self_attention.linear_qkv.bias" in ref["grads"]
    for pname, g in ref["grads"].items():
        assert_close(res.grads[pname], g, **GRAD, msg=lambda m: f"{pname}: {m}")


@pytest.mark.parametrize("kind", ["a2a", "all_gather"])
def test_gqa_kv_under_the_other_cp_variants(kind):
    """Ulysses moves q (a heads) and K/V (g heads) in separate all-to-alls; the all-gather variant
    gathers K/V with their g heads: both equal one device (the ring is in LAYOUTS)."""
    from labkit.measure.llama_family import parity
    r = parity(2, steps=2, context_parallel_size=2, cp_comm_type=kind)
    assert r["max_loss_diff"] < 1e-11 and r["max_grad_diff"] < 1e-12, r


# -- the two traps, and negative controls ----------------------------------------------------------
def test_rmsnorm_grads_are_summed_under_sp_and_fc1_is_cut_gate_r_up_r():
    """The tiny Llama cut over 2 tp ranks with SP, gradients finished from the shard plan, equals the
    dense model (labkit.measure.llama_family.trap_worker). Negative controls: with the RMSNorms not
    a "norm" to the TP plan (v2 found norms by class: their gradients go unsummed), or with fc1 =
    [gate; up] cut contiguously, some gradient moves far beyond the tolerance."""
    from labkit.measure.llama_family import traps
    diffs = traps(tp=2)
    assert diffs["plan"] < 1e-12, diffs
    assert diffs["norm not a role"] > 1e-6, diffs
    assert diffs["fc1 contiguous"] > 1e-6, diffs


# -- Megatron's own arguments, pinned --------------------------------------------------------------
def _kwargs(flags: list[str]) -> dict:
    """Flags as Megatron's args {dest: value}, read with labkit's table of Megatron's arguments."""
    from labkit.calc.megatron_args import FLAGS
    out, i = {}, 0
    while i < len(flags):
        dest, kind, stored = FLAGS[flags[i][2:]]
        if kind == "switch":
            out[dest], i = stored, i + 1
            continue
        text = flags[i + 1]
        for cast in (int, float, str):
            try:
                out[dest] = cast(text)
                break
            except ValueError:
                pass
        i += 2
    return out


@pytest.mark.parametrize("name", ["llama3-tiny tp2 sp", "llama3-tiny tp4 sp", "mixtral-tiny tp2 sp pp2 ep2"])
def test_to_flags_writes_the_flags_megatron_validated(name):
    """to_flags of the Llama family = the flags Megatron's parse_args + validate_args accepted at
    d98e8a64 (calc/megatron_args.CHECKED, checked once without CI); each is in Megatron's flag table
    and labkit's own emulation of validate_args accepts them."""
    from labkit.calc.megatron_args import CHECKED, CHECKED_LAYOUTS, FLAGS, megatron_args
    from labkit.config import TrainConfig
    from labkit.megatron_bridge import to_flags
    world, expected = CHECKED[name]
    family, layout = CHECKED_LAYOUTS[name]
    flags = to_flags(TrainConfig(**preset_args(family), micro_batch_size=2, global_batch_size=8, **layout), steps=10)
    assert " ".join(flags) == expected
    assert all(f[2:] in FLAGS for f in flags if f.startswith("--"))
    args = megatron_args(world, vocab_size=256, **_kwargs(flags))    # the check's tokenizer: 256 ids
    assert (args.normalization, args.swiglu, args.add_bias_linear, args.num_query_groups) == ("RMSNorm", True, False, 2)


def test_rules_for_the_family_name_the_numbers():
    from labkit.config import TrainConfig
    with pytest.raises(ValueError, match="num_query_groups a multiple or a divisor of TP; 3 and 2"):
        TrainConfig(**dict(LLAMA, num_attention_heads=6, num_query_groups=3, hidden_size=48),
                    tensor_model_parallel_size=2).validate(2)
    with pytest.raises(ValueError, match="K/V groups per TP rank divisible by CP"):
        TrainConfig(**LLAMA, context_parallel_size=4, cp_comm_type="a2a").validate(4)
    with pytest.raises(ValueError, match="normalization must be one of"):
        TrainConfig(normalization="BatchNorm")
    with pytest.raises(ValueError, match="group_query_attention needs num_query_groups"):
        TrainConfig(group_query_attention=True)

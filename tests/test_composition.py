"""Tier 2 (gloo ranks): every strategy composes - TP x PP x DP/ZeRO, with SP and interleaving.

Issue "labkit v2". Each layout trains 5 steps with ``labkit.train`` and is compared with
``labkit.reference`` (one device, whole batch, plain AdamW; an independent loop): the losses of all
5 steps, the gradient norm of every step, and every parameter's gradient after step 1, reassembled
under the dense model's names. float64 on CPU: only the order of additions differs, so the
tolerance is 1e-12 relative / 1e-12 absolute on gradients and 1e-11 on losses and norms.

The bugs that kept these layouts refused in version 1 each have a test here that fails on it:
ZeRO-2/3 skipping the SP gradient sum; the tied-embedding sum on a None gradient or rebinding
ZeRO-1's views; ZeRO's norm counting replicated and tied parameters twice; ZeRO-3 hooking a module
that is never called; the reference training on another global batch than labkit.train.
"""
from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

import labkit
from labkit.reference import train_reference

MODEL = dict(num_layers=4, hidden_size=32, num_attention_heads=4, seq_length=16, params_dtype="float64")
GRAD = dict(rtol=1e-12, atol=1e-12)

LAYOUTS = {  # name: (world size, layout); global batch 8, micro batch 2
    "tp2 pp2": (4, dict(tensor_model_parallel_size=2, pipeline_model_parallel_size=2)),
    "tp2 pp2 sp": (4, dict(tensor_model_parallel_size=2, pipeline_model_parallel_size=2,
                           sequence_parallel=True)),
    "tp2 pp2 vpp2 sp untied": (4, dict(tensor_model_parallel_size=2, pipeline_model_parallel_size=2,
                                       num_layers_per_virtual_pipeline_stage=1, sequence_parallel=True,
                                       untie_embeddings_and_output_weights=True)),
    "tp2 pp2 vpp2 dp2 sp": (8, dict(tensor_model_parallel_size=2, pipeline_model_parallel_size=2,
                                    num_layers_per_virtual_pipeline_stage=1, sequence_parallel=True)),
    "tp2 pp2 dp2 zero1": (8, dict(tensor_model_parallel_size=2, pipeline_model_parallel_size=2,
                                  use_distributed_optimizer=True)),
    "pp2 vpp2 dp2 zero1": (4, dict(pipeline_model_parallel_size=2, num_layers_per_virtual_pipeline_stage=1,
                                   use_distributed_optimizer=True)),
    "tp2 dp2 zero1": (4, dict(tensor_model_parallel_size=2, zero_stage=1)),
    "tp2 dp2 sp zero2": (4, dict(tensor_model_parallel_size=2, sequence_parallel=True, zero_stage=2)),
    "tp2 dp2 sp zero3": (4, dict(tensor_model_parallel_size=2, sequence_parallel=True, zero_stage=3)),
    "tp2 dp2 zero3 untied": (4, dict(tensor_model_parallel_size=2, zero_stage=3,
                                     untie_embeddings_and_output_weights=True)),
}


def run(world: int, layout: dict, **extra):
    kw = dict(MODEL, micro_batch_size=2, global_batch_size=8, **layout, **extra)
    res = labkit.train(world_size=world, steps=5, log_interval=0, capture_grads=True, **kw)
    ref = train_reference(world_size=world, steps=5, capture_grads=True, **kw)
    return res, ref


@pytest.fixture(scope="module", params=sorted(LAYOUTS))
def trained(request):
    world, layout = LAYOUTS[request.param]
    return request.param, run(world, layout)


def test_losses_and_grad_norms_equal_one_device(trained):
    name, (res, ref) = trained
    assert_close(torch.tensor(res.losses), torch.tensor(ref["losses"]), rtol=0, atol=1e-11, msg=name)
    assert_close(torch.tensor(res.grad_norms), torch.tensor(ref["grad_norms"]), rtol=1e-11, atol=0,
                 msg=f"{name}: gradient norm (each value counted once: the shard plan's owned_ranges)")


def test_every_parameter_gradient_equals_one_device(trained):
    name, (res, ref) = trained
    assert set(res.grads) == set(ref["grads"]), name
    for pname, g in ref["grads"].items():
        assert_close(res.grads[pname], g, **GRAD, msg=lambda m: f"{name}, {pname}: {m}")


def test_bytes_per_group_equal_calc(trained):
    """What every rank sent on each group (labkit.comm's counters, 5 steps) equals
    labkit.calc.composed.labkit_step_bytes for its pipeline and data-parallel rank, term by term."""
    from labkit.calc.composed import labkit_step_bytes
    name, (res, _) = trained
    if res.config.effective_zero_stage > 1:
        pytest.skip("labkit_step_bytes covers ZeRO up to stage 1; ZeRO-2/3 bytes: tests/test_zero.py")
    model, par = res.config.megatron_view(res.world_size)
    for r, rank in enumerate(res.ranks):
        c = rank["coords"]
        expected = labkit_step_bytes(model, par, c["pp"], bytes_per_element=8)
        got = {g: {op: v["bytes"] / 5 for op, v in ops.items()} for g, ops in rank["comm"].items()
               if ops and g in ("tp", "pp", "dp", "embd")}
        assert got == expected, f"{name}, rank {r} {c}"


def test_default_global_batch_is_the_same_in_train_and_reference():
    """Version 1's reference defaulted to one micro batch, labkit.train to micro batch x dp."""
    kw = dict(MODEL, num_layers=2, micro_batch_size=2)
    res = labkit.train(world_size=2, steps=2, log_interval=0, **kw)
    assert_close(torch.tensor(res.losses), torch.tensor(train_reference(world_size=2, steps=2, **kw)),
                 rtol=0, atol=1e-11)


def test_clipping_uses_the_global_norm_under_zero_and_tp():
    kw = dict(MODEL, micro_batch_size=2, global_batch_size=8, tensor_model_parallel_size=2,
              zero_stage=2, sequence_parallel=True, clip_grad=0.5)
    res = labkit.train(world_size=4, steps=3, log_interval=0, **kw)
    ref = train_reference(world_size=4, steps=3, **kw)
    assert_close(torch.tensor(res.losses), torch.tensor(ref), rtol=0, atol=1e-11)


@pytest.mark.parametrize("stage", [2, 3])
def test_zero2_and_zero3_with_pipelines_are_refused_with_the_reason(stage, monkeypatch):
    import labkit.launcher
    monkeypatch.setattr(labkit.launcher, "launch", lambda *a, **k: pytest.fail("launched"))
    with pytest.raises(ValueError, match=rf"zero_stage {stage} with pipeline_model_parallel_size 2.*"
                                         r"once per microbatch"):
        labkit.train(world_size=4, steps=1, pipeline_model_parallel_size=2, zero_stage=stage, **MODEL)

"""FP8 at runtime (labkit.fp8.linear): a parallel FP8 run equals the one-device FP8 run.

The oracle is ``labkit.reference.train_reference``: the dense model, no process groups, the same
quantizer on its linear layers, the global batch in global microbatches (mbs x dp samples: the
tensor one reduced amax covers). float64 parameters, so a round-off difference of the parallel
sums cannot flip an FP8 rounding: the bound is float64's (1e-12 on the losses, 1e-10 on gradients).
Negative control: amaxes reduced over tp only (Megatron's --tp-only-amax-red) under dp = 2.
"""
import os

import pytest
import torch

import labkit
from labkit.reference import train_reference

BASE = dict(micro_batch_size=1, global_batch_size=4, params_dtype="float64", seq_length=32,
            fp8="hybrid", fp8_amax_history_len=4, fp8_amax_compute_algo="max")
LAYOUTS = {
    "dp2": dict(),
    "tp2 sp": dict(tensor_model_parallel_size=2, sequence_parallel=True),
    "pp2": dict(pipeline_model_parallel_size=2),
    "dp2 zero1": dict(zero_stage=1),
    "cp2": dict(context_parallel_size=2),
}


def _run(world, steps=2, **cfg):
    ref = train_reference(world_size=world, steps=steps, capture_grads=True, **cfg)
    got = labkit.train(world_size=world, steps=steps, log_interval=0, capture_grads=True, **cfg)
    return ref, got


# one in the suite; the rest repeat its path on other layouts: the breadth step of .ci/run runs them
BREADTH = (pytest.mark.slow, pytest.mark.skipif(not os.environ.get("LABKIT_BREADTH"), reason=(
    "every other layout x recipe: the breadth step of .ci/run runs it (LABKIT_BREADTH=1)")))
CASES = [pytest.param(layout, recipe, id=f"{layout}-{recipe}", marks=() if (layout, recipe) in (
    ("tp2 sp", "delayed"),) else BREADTH)
    for layout in LAYOUTS for recipe in ("tensorwise", "delayed")]


@pytest.mark.parametrize("layout,recipe", CASES)
def test_parallel_fp8_run_equals_one_device_fp8_run(layout, recipe):
    cfg = dict(BASE, fp8_recipe=recipe, **LAYOUTS[layout])
    ref, got = _run(2, **cfg)
    torch.testing.assert_close(torch.tensor(got.losses), torch.tensor(ref["losses"]), rtol=0, atol=1e-12)
    for name, g in ref["grads"].items():
        torch.testing.assert_close(got.grads[name], g, rtol=1e-10, atol=1e-12, msg=name)
    fp64 = train_reference(world_size=2, steps=2, **dict(cfg, fp8=None))
    assert max(abs(a - b) for a, b in zip(ref["losses"], fp64)) > 1e-5     # FP8 really ran


@pytest.mark.parametrize("recipe", ["tensorwise", pytest.param("delayed", marks=BREADTH)])
def test_without_the_dp_amax_reduction_the_run_drifts(recipe):
    cfg = dict(BASE, fp8_recipe=recipe, tp_only_amax_red=True)
    ref, got = _run(2, **cfg)
    assert max(abs(a - b) for a, b in zip(got.losses, ref["losses"])) > 1e-6


def test_fp8_refusals():
    for bad, msg in [(dict(fp8="e5m2"), "fp8_format must be"), (dict(fp8="hybrid", fp8_recipe="rowwise"), "fp8_recipe"),
                     (dict(fp8="hybrid", bf16=True), "fp8 with bf16"),
                     (dict(fp8="hybrid", fp8_amax_compute_algo="mean"), "fp8_amax_compute_algo"),
                     (dict(fp8="hybrid", implementation="native"), "labkit's own implementation")]:
        with pytest.raises(ValueError, match=msg):
            labkit.train(world_size=1, **bad)

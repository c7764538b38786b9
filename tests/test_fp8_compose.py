"""FP8 with the axes tests/test_fp8_runtime.py leaves out: EP, VPP, ZeRO-2/3, recompute, checkpoints.

Same oracle and bound as there: ``labkit.reference.train_reference`` runs the dense model with the
same quantizers over global microbatches (mbs x dp samples), float64 parameters, 2 microbatches per
rank; a parallel FP8 run equals it to 1e-12 on the losses and 1e-10 on the gradients.

    ep2                 routed experts' linears in FP8, amaxes over the ranks holding that expert
                        (etp x edp); over the whole stage, as Megatron's one group does, the loss
                        drifts by 6.6e-4 (measured: experts 0 and 2 would share a scale)
    ep negative control the same runs with the experts' amax group replaced inside the ranks: over the
                        stage (2 ranks, ep2) or not reduced at all (4 ranks, ep2 x edp2: an expert's
                        two replicas scale their own tokens) drift beyond the bound; the right one not
    recompute           the recomputed forward quantizes with the first forward's delayed scales
                        and leaves the histories alone (one update per forward); the unit test
                        below fails without it
    checkpoint          delayed scaling's histories and scales saved and restored: a resumed run is
                        the uninterrupted one bit for bit; the same checkpoint with its FP8 state
                        ignored (fresh histories) is not
    fp8_param_gather    ZeRO-3 gathers the FP8 linears' weights as FP8 bytes (1 per element): the
                        same run to the same bound, its all-gather bytes those of labkit.calc
"""
import json
import os

import pytest
import torch

import labkit
from labkit.calc.comm import dp_step_bytes
from labkit.calc.kernels import fp8_gather_bytes
from labkit.checkpoint import files
from labkit.reference import train_reference

BASE = dict(micro_batch_size=1, global_batch_size=4, params_dtype="float64", seq_length=32,
            fp8="hybrid", fp8_amax_history_len=4, fp8_amax_compute_algo="max")
LAYOUTS = {
    "ep2": dict(num_experts=4, expert_model_parallel_size=2, moe_router_topk=2),
    "ep2 tp2 sp etp2": dict(num_experts=4, expert_model_parallel_size=2, moe_router_topk=2,   # 4 ranks
                            tensor_model_parallel_size=2, sequence_parallel=True),
    "pp2 vpp2": dict(pipeline_model_parallel_size=2, num_layers=4, num_layers_per_virtual_pipeline_stage=1),
    "dp2 zero2": dict(zero_stage=2),
    "dp2 zero3": dict(zero_stage=3),
    "recompute full": dict(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1),
    "recompute selective": dict(recompute_granularity="selective", recompute_modules=("core_attn", "mlp")),
}
BREADTH = (pytest.mark.slow, pytest.mark.skipif(not os.environ.get("LABKIT_BREADTH"), reason=(
    "every other layout x recipe: the breadth step of .ci/run runs it (LABKIT_BREADTH=1)")))
SUITE = {("ep2", "delayed"), ("recompute full", "delayed")}     # the new code paths; the rest: breadth
CASES = [pytest.param(layout, recipe, id=f"{layout}-{recipe}", marks=() if (layout, recipe) in SUITE else BREADTH)
         for layout in LAYOUTS for recipe in ("tensorwise", "delayed")]


@pytest.mark.parametrize("layout,recipe", CASES)
def test_parallel_fp8_run_equals_one_device_fp8_run(layout, recipe):
    cfg = dict(BASE, fp8_recipe=recipe, **LAYOUTS[layout])
    world = 4 if "etp2" in layout else 2
    ref = train_reference(world_size=world, steps=2, capture_grads=True, **cfg)
    got = labkit.train(world_size=world, steps=2, log_interval=0, capture_grads=True, **cfg)
    torch.testing.assert_close(torch.tensor(got.losses), torch.tensor(ref["losses"]), rtol=0, atol=1e-12)
    assert set(got.grads) == set(ref["grads"])
    for name, g in ref["grads"].items():
        torch.testing.assert_close(got.grads[name], g, rtol=1e-10, atol=1e-12, msg=name)


def test_recompute_reuses_the_first_forwards_delayed_scales():
    """Two microbatches through a recomputed FP8 linear (forward, forward, backward, backward, as
    1F1B interleaves them) give the gradients and histories of the plain linear."""
    from labkit.fp8.linear import FP8Recipe, LinearFP8
    from labkit.recompute import checkpoint
    torch.manual_seed(0)
    w0 = torch.randn(16, 32, dtype=torch.float64)
    xs = [torch.randn(4, 32, dtype=torch.float64) * (1 + i) for i in range(2)]
    recipe = FP8Recipe("hybrid", "delayed", 4, "max")

    def run(recompute):
        fp8, w = LinearFP8(recipe), w0.clone().requires_grad_()
        ys = [checkpoint(fp8.linear, [], x, w) if recompute else fp8.linear(x, w) for x in xs]
        for y in ys:
            (y * y).sum().backward()
        assert not fp8.recompute_scales                  # every queued scale taken back
        return w.grad, {r: d.history for r, d in fp8.delayed.items()}

    (g0, h0), (g1, h1) = run(False), run(True)
    assert h1["input"].numel() == 2                      # one update per microbatch, not two
    torch.testing.assert_close(g1, g0, rtol=0, atol=0)
    for r in h0:
        torch.testing.assert_close(h1[r], h0[r], rtol=0, atol=0)


def test_fp8_resume_is_bit_exact_and_needs_the_amax_histories(tmp_path):
    kw = dict(BASE, fp8_recipe="delayed", seq_length=16)
    whole = labkit.train(world_size=2, steps=4, log_interval=0, **kw)
    labkit.train(world_size=2, steps=2, log_interval=0, save=tmp_path, **kw)
    rest = labkit.train(world_size=2, steps=4, log_interval=0, load=tmp_path, **kw)
    assert rest.ranks[0]["start"] == 2 and rest.losses == whole.losses[2:]
    # the negative control: the same checkpoint, told it holds no FP8 state (fresh histories)
    folder = files.iteration_dir(tmp_path, 2)
    info = json.loads((folder / files.INFO).read_text())
    assert info["fp8_state"] is True
    (folder / files.INFO).write_text(json.dumps(dict(info, fp8_state=False)))
    files.write_manifest(folder)
    fresh = labkit.train(world_size=2, steps=4, log_interval=0, load=tmp_path, **kw)
    assert fresh.losses != whole.losses[2:]


@BREADTH[0]
@BREADTH[1]
def test_fp8_state_loads_into_another_layout(tmp_path):
    """Saved under dp2 (2 ranks), resumed under dp2 x tp2 + SP (4 ranks): the same global
    microbatches, so the same run to float64 round-off (measured 8.9e-16; without the FP8 state
    1.5e-3): each linear finds its histories under its dense name."""
    kw = dict(BASE, fp8_recipe="delayed", seq_length=16)
    whole = labkit.train(world_size=2, steps=4, log_interval=0, **kw)
    labkit.train(world_size=2, steps=2, log_interval=0, save=tmp_path, **kw)
    rest = labkit.train(world_size=4, steps=4, log_interval=0, load=tmp_path, tensor_model_parallel_size=2,
                        sequence_parallel=True, **kw)
    torch.testing.assert_close(torch.tensor(rest.losses), torch.tensor(whole.losses[2:]), rtol=0, atol=1e-12)


def test_fp8_gather_bytes_in_calc():
    """ZeRO-3, n = 4, m = 2: each step gathers the parameters 2m times, (n-1)/n of E + R bytes each."""
    p, e, r = 800.0, 60, 80.0                          # P bytes; E FP8 elements; R bytes of the rest
    got = dp_step_bytes(p, 4, 3, num_microbatches=2, gather_bytes=fp8_gather_bytes(e, r))
    assert got == {"reduce_scatter": 2 * 0.75 * p, "all_gather": 4 * 0.75 * (e + r)}
    assert dp_step_bytes(p, 4, 3, num_microbatches=2) == dict(got, all_gather=4 * 0.75 * p)


@pytest.mark.parametrize("recipe", ["delayed", pytest.param("tensorwise", marks=BREADTH)])
def test_zero3_fp8_param_gather_equals_one_device_and_calc(recipe):
    cfg = dict(BASE, fp8_recipe=recipe, zero_stage=3, fp8_param_gather=True)
    ref = train_reference(world_size=2, steps=2, capture_grads=True, **cfg)
    got = labkit.train(world_size=2, steps=2, log_interval=0, capture_grads=True, **cfg)
    torch.testing.assert_close(torch.tensor(got.losses), torch.tensor(ref["losses"]), rtol=0, atol=1e-12)
    for name, g in ref["grads"].items():
        torch.testing.assert_close(got.grads[name], g, rtol=1e-10, atol=1e-12, msg=name)
    # bytes: the FP8 linears' weights (qkv, proj, fc1, fc2) at 1 B, the rest at 8 (float64)
    fp8 = {n for n in ref["grads"] if n.endswith(".weight") and any(
        f".{k}." in n for k in ("linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"))}
    e = sum(ref["grads"][n].numel() for n in fp8)
    p = sum(g.numel() for g in ref["grads"].values())
    assert e > p / 2                                   # most of the model travels in FP8
    want = dp_step_bytes(8.0 * p, 2, 3, num_microbatches=2, gather_bytes=fp8_gather_bytes(e, 8.0 * (p - e)))
    for rank in got.ranks:
        assert rank["comm"]["dp"]["all_gather"]["bytes"] / 2 == want["all_gather"]
        assert rank["comm"]["dp"]["reduce_scatter"]["bytes"] / 2 == want["reduce_scatter"]


def test_fp8_param_gather_refusals():
    z3 = dict(fp8="hybrid", zero_stage=3, fp8_param_gather=True)
    for bad, msg in [(dict(z3, fp8=None), "per-tensor recipe"), (dict(z3, fp8_recipe="mxfp8"), "cuts blockwise"),
                     (dict(z3, zero_stage=1), "ZeRO-3 only"),
                     (dict(z3, recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1),
                      "one gathered scale per weight")]:
        with pytest.raises(ValueError, match=msg):
            labkit.train(world_size=2, **bad)


def test_expert_amaxes_are_reduced_over_the_ranks_holding_that_expert():
    """Pure (no processes): dense linears reduce over the stage; an expert's over etp x edp, never
    over ep (another rank's experts: with the stage's group, the ep2 run drifts by 6.6e-4)."""
    from labkit.fp8.linear import amax_ranks
    from labkit.topology import Topology
    t = Topology(4, ep=2)                                      # dp 4 = ep 2 x edp 2, etp 1
    assert amax_ranks(t) == [[0, 1, 2, 3]] and amax_ranks(t, expert=True) == [[0, 2], [1, 3]]
    assert sorted(amax_ranks(t, tp_only=True, expert=True)) == [[0], [1], [2], [3]]
    t = Topology(8, tp=2, pp=2, ep=2)                          # etp 2, edp 1 per stage
    assert amax_ranks(t) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert amax_ranks(t, expert=True) == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert amax_ranks(t, tp_only=True) == [[0, 1], [2, 3], [4, 5], [6, 7]]


def _experts_amax_worker(wrong: str, *args):
    """labkit.training's rank worker, the routed experts' amax group replaced: "stage" (every rank of
    the pipeline stage, Megatron's one amax group: two experts share a scale) or "none" (no
    reduction: each replica of an expert scales from its own tokens)."""
    from labkit import training
    from labkit.fp8 import linear
    right = linear.amax_group

    def amax_group(topo, tp_only=False, expert=False):
        group = right(topo, tp_only, expert)               # every group still made, in order, on every rank
        if not expert:
            return group
        return right(topo, tp_only) if wrong == "stage" else None
    linear.amax_group = amax_group                         # parallelize imports it when it builds the model
    return training._worker(*args)


@pytest.mark.parametrize("wrong,world,layout", [
    ("stage", 2, dict(num_experts=4, expert_model_parallel_size=2, moe_router_topk=2)),
    ("none", 4, dict(num_experts=4, expert_model_parallel_size=2, moe_router_topk=2, global_batch_size=8))])
def test_experts_amax_outside_their_group_drifts_the_right_group_does_not(wrong, world, layout):
    """The negative control of the ep layouts: the right expert amax group gives the one-device FP8
    run (1e-12; measured 8.9e-16 and 0); the wrong one differs by far more than that bound (measured
    6.6e-4 over the stage, 5.5e-4 with no reduction; delayed: 6.9e-4 and 1.2e-4). About 35 s for both."""
    from labkit.launcher import launch
    from labkit.training import _result, train_config
    cfg = dict(BASE, fp8_recipe="tensorwise", **layout)
    ref = train_reference(world_size=world, steps=2, **cfg)
    right = labkit.train(world_size=world, steps=2, log_interval=0, **cfg)
    c = train_config(**cfg)
    c.validate(world)
    bad = _result(launch(_experts_amax_worker, world, wrong, c, 2, 0, 0, False, None, None, timeout=600),
                  c, world, False)
    right_gap = max(abs(a - b) for a, b in zip(right.losses, ref))
    wrong_gap = max(abs(a - b) for a, b in zip(bad.losses, ref))
    assert right_gap <= 1e-12, right_gap
    assert wrong_gap > 1e-6, f"the experts' amax outside their group changed the loss by only {wrong_gap:.3g}"

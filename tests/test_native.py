"""Tier 2 (gloo ranks): PyTorch's own parallel APIs train like labkit and like one device.

Issue 26. Each layout runs ``labkit.native`` (DeviceMesh, parallelize_module, FSDP2,
torch.distributed.pipelining) for 5 steps in float64 and is compared with ``labkit.reference``
(the independent single-device loop) and, where labkit has the layout, with ``labkit.train``'s own
implementation: the loss of every step, the gradient norm of every step, and every parameter's
gradient after step 1, reassembled under the dense model's names. Only the order of additions
differs, so the tolerances are float64's: 1e-12 on gradients, 1e-11 on losses and norms.

The same runs check the bytes: what the native step sent on each axis, counted on every rank
(``ByteCounter``, beside CommDebugMode's call counts), equals ``labkit.native.bytes``'s prediction
to the byte, and ``labkit.calc`` predicts labkit's own counters (the differences between the two
are the terms ``bytes.py`` lists). Layouts of one world size share a launch (``compare``).
"""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from torch.testing import assert_close

from labkit.config import train_config
from labkit.native import NativeOptions
from labkit.native.bytes import labkit_calc_bytes, native_step_bytes
from labkit.native.compare import LAYOUTS, LLAMA, PP, Layout, run_layouts

MODEL = dict(hidden_size=32, num_attention_heads=4, seq_length=16)
GRAD = dict(rtol=1e-12, atol=1e-12)
LOSS = dict(rtol=1e-11, atol=1e-11)
BY_NAME = {lay.name: lay for lay in LAYOUTS}


def small(name: str) -> Layout:
    lay = BY_NAME[name]
    return replace(lay, config={**MODEL, **lay.config},
                   labkit=None if lay.labkit is None else {**MODEL, **lay.labkit})


def llama(name: str) -> Layout:
    """Layout ``name`` with the Llama family's model (RMSNorm, SwiGLU, RoPE, 8 heads in 2 K/V groups)."""
    lay = BY_NAME[name]                                   # its own fields win (PP's 4 layers)
    return replace(lay, name=f"Llama: {name}", config={**MODEL, **LLAMA, **lay.config}, labkit=None)


def assert_same_training(run: dict, ref: dict, what: str) -> None:
    assert_close(torch.tensor(run["losses"]), torch.tensor(ref["losses"]), **LOSS, msg=f"{what}: losses")
    assert_close(torch.tensor(run["grad_norms"]), torch.tensor(ref["grad_norms"]), **LOSS,
                 msg=f"{what}: grad norms")
    assert set(run["grads"]) == set(ref["grads"]), f"{what}: parameter names differ"
    for name, g in ref["grads"].items():
        assert_close(run["grads"][name].double(), g.double(), **GRAD, msg=f"{what}: gradient of {name}")


def bytes_of(table: dict) -> dict:
    """{axis: {op: bytes}} from a counter table."""
    return {axis: {op: v["bytes"] for op, v in ops.items()} for axis, ops in table.items() if ops}


def check_native_bytes(lay: Layout, run: dict) -> None:
    """Every rank's last step sent what bytes.native_step_bytes predicts, axis by axis."""
    cfg = train_config(params_dtype="float64", **lay.config)
    for rank, counted in enumerate(run["comm_last_step"]):
        assert bytes_of(counted) == native_step_bytes(cfg, lay.world_size, lay.native, rank), (lay.name, rank)


@pytest.fixture(scope="module")
def two_ranks():
    """FSDP2 with and without resharding, TP + SP + loss parallel (GPT-2 and Llama): native and
    labkit, 2 ranks."""
    lays = [small(n) for n in ("FSDP2 (reshard after forward)", "FSDP2 (no reshard)", "TP + SP + loss parallel",
                               "Llama: TP + SP + loss parallel")]
    return lays, run_layouts(lays, steps=5)


def test_fsdp2_and_tp_sp_train_like_labkit_and_one_device(two_ranks):
    lays, runs = two_ranks
    for lay in lays:
        r = runs[lay.name]
        assert_same_training(r["native"], r["reference"], f"{lay.name}, native vs reference")
        assert_same_training(r["native"], r["labkit"], f"{lay.name}, native vs labkit")


def test_native_bytes_are_predicted_and_differ_from_labkit_only_as_explained(two_ranks):
    lays, runs = two_ranks
    for lay in lays:
        check_native_bytes(lay, runs[lay.name]["native"])
    z3, z2, tpsp = (runs[lay.name] for lay in lays[:3])
    # FSDP2: the same bytes as labkit's ZeRO-3 / ZeRO-2 (and labkit.calc), in more calls: one
    # all-gather and one reduce-scatter per fully_shard unit (2 layers + the root)
    for r, lay, gathers in ((z3, lays[0], 2), (z2, lays[1], 1)):
        native, labkit = r["native"]["comm_last_step"][0]["dp"], r["labkit"]["comm"][0]["dp"]
        assert {op: v["bytes"] for op, v in native.items()} == {op: labkit[op]["bytes"] / 5 for op in labkit}
        assert native["all_gather"]["calls"] == 3 * gathers and native["reduce_scatter"]["calls"] == 3
        assert labkit_calc_bytes(train_config(params_dtype="float64", **lay.config), 2)["dp"] == \
            {op: v["bytes"] for op, v in native.items()}
    # CommDebugMode counted the same calls as the byte counter, op by op
    counted = {op: v["calls"] for op, v in tpsp["native"]["comm"][0]["tp"].items()}
    debug = {k.split(".")[-1].replace("_into_tensor", "").replace("_tensor", ""): v
             for k, v in tpsp["native"]["comm_debug"].items()}
    assert counted == debug
    # TP + SP: native - labkit = the terms of bytes.py, each computed by hand here
    cfg = train_config(params_dtype="float64", **lays[2].config)
    b, s, h, e, t = cfg.micro_batch_size, cfg.seq_length, cfg.hidden_size, 8, 2
    N = b * s * h * e
    native = bytes_of(tpsp["native"]["comm_last_step"][0])["tp"]
    labkit = {op: v / 5 for op, v in bytes_of(tpsp["labkit"]["comm"][0])["tp"].items()}
    assert labkit == labkit_calc_bytes(cfg, 2)["tp"]
    # embedding: reduce-scatter N/2 instead of all-reduce N; the positions' gradient gathered;
    # loss parallel: 3 all-reduces of [b, s] instead of gathering t maxima + 2 all-reduces;
    # SP sums: only the norms' gradients (4h per layer + 2h), not the row-parallel biases (2h per layer)
    assert native["reduce_scatter"] - labkit["reduce_scatter"] == N / 2
    assert native["all_gather"] - labkit["all_gather"] == s * h * e / 2 - t * b * s * e / 2
    assert native["all_reduce"] - labkit["all_reduce"] == -N + (3 - 2) * b * s * e - 2 * h * cfg.num_layers * e


def test_llama_family_through_the_native_plan(two_ranks):
    """RMSNorm, SwiGLU, RoPE and GQA (8 heads, 2 K/V groups) under TP + SP + loss parallel: the
    plan found by role cuts SwiGLU's fc1 as [gate_r; up_r] and whole query groups, RoPE reads the
    gathered sequence's positions, and the step sends what bytes.py predicts: no position table
    (nothing to gather), RMSNorm's weight alone summed over tp (no bias), no bias anywhere."""
    lays, runs = two_ranks
    lay = lays[3]
    cfg = train_config(params_dtype="float64", **lay.config)
    assert (cfg.normalization, cfg.swiglu, cfg.position_embedding_type, cfg.query_groups,
            cfg.num_attention_heads, cfg.add_bias_linear) == ("RMSNorm", True, "rope", 2, 8, False)
    r = runs[lay.name]
    assert_same_training(r["native"], r["reference"], "Llama, native vs reference")
    assert_same_training(r["native"], r["labkit"], "Llama, native vs labkit")
    check_native_bytes(lay, r["native"])
    b, s, h, e, t = cfg.micro_batch_size, cfg.seq_length, cfg.hidden_size, 8, 2
    m, ring = cfg.num_microbatches(cfg.topology(2)), 2 * (t - 1) / t
    sums = (2 * cfg.num_layers + 1) * h * e                 # RMSNorm weights: 2 per layer + the final one
    native = bytes_of(r["native"]["comm_last_step"][0])["tp"]
    assert native["all_reduce"] == ring * (m * 3 * b * s * e + sums)   # loss parallel's 3 [b, s], the norms
    # all-gathers of [b, s, h]: per layer in front of qkv and fc1 and in the backward of proj's and
    # fc2's reduce-scatters; the embedding's reduce-scatter's backward; the output layer's input.
    # No position table under RoPE, so nothing else (GPT-2 also gathers its [s/t, h] positions' grad)
    assert native["all_gather"] == (4 * cfg.num_layers + 2) * m * b * s * h * e * (t - 1) / t


def test_pipelining_schedules_train_like_labkit_and_one_device():
    """1F1B and Interleaved1F1B against labkit's same schedules; InterleavedZeroBubble, ZB-V and
    DualPipeV (orders labkit does not run; its V schedule is gpipe_v) against the reference and labkit's 1F1B."""
    names = ("PP 1F1B", "PP Interleaved1F1B", "PP InterleavedZeroBubble", "PP ZBVZeroBubble", "PP DualPipeV")
    lays = [small(n) for n in names]
    runs = run_layouts(lays[:2], steps=5)
    zbv_llama = llama("PP ZBVZeroBubble")                  # the V with RoPE, SwiGLU and GQA: as one device
    runs.update(run_layouts([*lays[2:], zbv_llama], steps=5, implementations=("native",)))
    r = runs.pop(zbv_llama.name)
    assert_same_training(r["native"], r["reference"], f"{zbv_llama.name} vs reference")
    check_native_bytes(zbv_llama, r["native"])
    for lay in lays:
        r = runs[lay.name]
        assert_same_training(r["native"], r["reference"], f"{lay.name} vs reference")
        labkit = runs[lays[1 if "Interleaved" in lay.name else 0].name]["labkit"]
        assert_same_training(r["native"], labkit, f"{lay.name} vs labkit")
        check_native_bytes(lay, r["native"])
    # the V's turn (stage p-1 to p) stays on the last rank: rank 0 sends twice 1F1B's messages,
    # each the tensor alone (labkit adds a 24-byte header naming it)
    one, zbv = runs["PP 1F1B"]["native"]["comm_last_step"][0], runs["PP ZBVZeroBubble"]["native"]["comm_last_step"][0]
    assert zbv["pp"]["send"]["bytes"] == 2 * one["pp"]["send"]["bytes"]
    labkit = runs["PP 1F1B"]["labkit"]["comm"][0]["pp"]
    assert labkit["send"]["bytes"] / 5 == one["pp"]["send"]["bytes"] and "p2p_header" in labkit


def test_fsdp_x_tp_and_hsdp_on_four_ranks():
    lays = [small("FSDP x TP (2-D)"), small("HSDP 2 x 2"), llama("FSDP x TP (2-D)")]
    runs = run_layouts(lays, steps=5, implementations=("native",))
    for lay in lays:
        assert_same_training(runs[lay.name]["native"], runs[lay.name]["reference"], lay.name)
        check_native_bytes(lay, runs[lay.name]["native"])
    hsdp = runs["HSDP 2 x 2"]["native"]["comm_last_step"][0]
    assert set(hsdp) == {"dp_shard", "dp_replicate"}       # reduce-scatter in, all-reduce across


def test_pp_dp_tp_on_eight_ranks():
    lay = small("PP x DP x TP (ZB-V)")
    runs = run_layouts([lay], steps=5, implementations=("native",))
    assert_same_training(runs[lay.name]["native"], runs[lay.name]["reference"], lay.name)
    check_native_bytes(lay, runs[lay.name]["native"])


def test_bf16_mixed_precision_through_labkit_train():
    """FSDP2's MixedPrecisionPolicy (bf16 compute, fp32 reduce) via ``labkit.train``: the losses
    stay within two bf16 steps of the fp32 reference (bf16 keeps 8 significant bits: at a loss of
    about 5.5 one step is 2**-5), the all-gathers move half the bytes of fp32, the
    reduce-scatters the same."""
    import labkit
    from labkit.reference import train_reference
    cfg = dict(MODEL, zero_stage=3)
    r = labkit.train(world_size=2, steps=5, log_interval=0, implementation=NativeOptions(mixed_precision="bf16"), **cfg)
    ref = train_reference(world_size=2, steps=5, **cfg)
    assert all(abs(a - b) <= 2 * 2 ** -5 for a, b in zip(r.losses, ref)), (r.losses, ref)
    assert r.losses != ref                                  # it did run in bf16
    counted = bytes_of(r.ranks[0]["comm_last_step"])["dp"]
    fp32 = native_step_bytes(train_config(**cfg), 2, NativeOptions())["dp"]
    assert counted == {"all_gather": fp32["all_gather"] / 2, "reduce_scatter": fp32["reduce_scatter"]}

"""Tier 2 (gloo ranks): expert parallelism equals one device, and its bytes and memory equal calc.

Issue 11. EP 2 and 4, dropless and with a capacity factor, both dispatchers, top-1 and top-2, with
DP (ZeRO-1), TP + SP (etp 1 and etp = tp) and PP (EP 4 dropless is the one-step bytes test). Every
layout trains a 2-layer MoE GPT (4 experts, both layers MoE, aux loss and z-loss
on) for 5 steps with ``labkit.train`` in float64 and is compared with ``labkit.reference`` (one
device, microbatch by microbatch as Megatron routes them; an independent loop that imports no
parallel code): the losses and gradient norms of all 5 steps, every parameter's gradient after
step 1 (experts reassembled by name), and the logged MoE values (load_balancing_loss, z_loss,
tokens per expert, dropped fraction) of every step. Capacity is computed per rank from its local
tokens, as Megatron does; each rank's local tokens are one microbatch (EP folds into DP), which
is what the single device routes at once, so the drops are the same: the test checks they are
equal and that some happened. With sequence parallelism each rank holds s/t positions and counts
its capacity over them (Megatron does the same); the reference drops over the same t slices of
each microbatch (``moe_routing_groups``, tp under SP), and "ep2 tp2 sp etp2 alltoall pad" drops.

Bytes: the all-to-all bytes per rank equal ``calc.comm.ep_layer_bytes`` exactly when tokens are
padded to capacity (a balanced dispatch; with etp > 1 the all-gather / reduce-scatter over etp
equal ``expert_tp_layer_bytes``), and ``calc.comm.ep_routed_bytes`` for the rows the
single-device model routes when dropless (the measured imbalance); the all-gather dispatcher's
equal ``ep_allgather_layer_bytes``. Memory per rank for EP 1/2/4 equals
``calc.memory.memory_per_stage``, experts and their ZeRO-1 shards included. A gpu-marked test
repeats EP 2 on NCCL.
"""
from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

import labkit
from labkit import calc
from labkit.measure.expert_parallel import expected_alltoall_bytes, memory_worker, routed_counts
from labkit.reference import train_reference

MOE = dict(num_layers=2, hidden_size=32, num_attention_heads=4, seq_length=16, params_dtype="float64",
           num_experts=4, moe_ffn_hidden_size=32, moe_aux_loss_coeff=1e-2, moe_z_loss_coeff=1e-3,
           micro_batch_size=2, global_batch_size=8)
GRAD = dict(rtol=1e-12, atol=1e-12)   # float64: only the order of additions differs
A2A, AG = dict(moe_token_dispatcher_type="alltoall"), dict(moe_token_dispatcher_type="allgather")
STEPS = 5

LAYOUTS = {  # name: (world size, layout)
    "ep2 allgather top1 capacity": (2, dict(expert_model_parallel_size=2, moe_router_topk=1,
                                            moe_router_pre_softmax=True, moe_expert_capacity_factor=1.0, **AG)),
    "ep4 alltoall top2 capacity pad position": (4, dict(expert_model_parallel_size=4, moe_expert_capacity_factor=1.0,
                                                        moe_pad_expert_input_to_capacity=True,
                                                        moe_token_drop_policy="position", **A2A)),
    "ep2 dp2 zero1 alltoall capacity": (4, dict(expert_model_parallel_size=2, use_distributed_optimizer=True,
                                                moe_expert_capacity_factor=1.0, **A2A)),
    "ep2 tp2 sp etp1 alltoall seq_aux": (4, dict(expert_model_parallel_size=2, tensor_model_parallel_size=2,
                                                 sequence_parallel=True, expert_tensor_parallel_size=1,
                                                 moe_router_load_balancing_type="seq_aux_loss", **A2A)),
    "ep2 tp2 sp etp2 alltoall pad": (4, dict(expert_model_parallel_size=2, tensor_model_parallel_size=2,
                                             sequence_parallel=True, moe_expert_capacity_factor=1.0,
                                             moe_pad_expert_input_to_capacity=True, **A2A)),
    "ep2 tp2 sp etp2 allgather": (4, dict(expert_model_parallel_size=2, tensor_model_parallel_size=2,
                                          sequence_parallel=True, **AG)),
    "ep2 pp2 alltoall capacity": (4, dict(expert_model_parallel_size=2, pipeline_model_parallel_size=2,
                                          moe_expert_capacity_factor=1.0, **A2A)),
    "ep2 tp2 sp shared alltoall": (4, dict(expert_model_parallel_size=2, tensor_model_parallel_size=2,
                                           sequence_parallel=True, moe_shared_expert_intermediate_size=48,
                                           **A2A)),   # shared expert cut over tp like the dense MLP
}


@pytest.fixture(scope="module", params=list(LAYOUTS))
def trained(request):
    world, layout = LAYOUTS[request.param]
    kw = dict(MOE, **layout)
    res = labkit.train(world_size=world, steps=STEPS, log_interval=0, capture_grads=True, **kw)
    ref = train_reference(world_size=world, steps=STEPS, capture_grads=True, **kw)
    return request.param, kw, res, ref


def test_losses_norms_and_moe_log_equal_one_device(trained):
    name, kw, res, ref = trained
    assert_close(torch.tensor(res.losses), torch.tensor(ref["losses"]), rtol=0, atol=1e-11, msg=name)
    assert_close(torch.tensor(res.grad_norms), torch.tensor(ref["grad_norms"]), rtol=1e-11, atol=0, msg=name)
    for step, (got, want) in enumerate(zip(res.moe, ref["moe"])):
        assert got["tokens_per_expert"] == want["tokens_per_expert"], (name, step)
        assert got["dropped_fraction"] == want["dropped_fraction"], (name, step)
        for key in ("load_balancing_loss", "z_loss"):
            assert got[key] == pytest.approx(want[key], rel=1e-11), (name, step, key)
    if kw.get("moe_expert_capacity_factor"):
        assert any(m["dropped_fraction"] > 0 for m in ref["moe"]), f"{name}: no token was dropped"


def test_every_gradient_equals_one_device(trained):
    name, _, res, ref = trained
    assert set(res.grads) == set(ref["grads"]), name
    for pname, g in ref["grads"].items():
        assert_close(res.grads[pname], g, **GRAD, msg=lambda m: f"{name}, {pname}: {m}")


def _bytes(res, rank: int, group: str, op: str) -> float:
    return res.ranks[rank]["comm"][group].get(op, {}).get("bytes", 0.0)


def test_padded_dispatch_bytes_equal_calc(trained):
    """Padded to capacity, every rank sends E*C rows per layer and microbatch, whatever the router
    does: the bytes are calc's exactly (all-to-all over ep, all-gather / reduce-scatter over etp)."""
    name, kw, res, _ = trained
    if not kw.get("moe_pad_expert_input_to_capacity"):
        pytest.skip("the padded layouts")
    world, _ = LAYOUTS[name]
    tp, ep, E, h = kw.get("tensor_model_parallel_size", 1), kw["expert_model_parallel_size"], 4, kw["hidden_size"]
    T = kw["micro_batch_size"] * kw["seq_length"] // tp                     # tokens a rank routes
    rows = E * calc.moe.get_capacity(T * 2, E, kw["moe_expert_capacity_factor"])
    m = kw["global_batch_size"] // (kw["micro_batch_size"] * (world // tp))
    if tp == 1:                      # C = T k / E: the padded dispatch IS the balanced router's
        assert rows == T * 2 and calc.comm.ep_layer_bytes(kw["seq_length"], kw["micro_batch_size"], h, ep, 2, 8) \
            == calc.comm.ep_layer_bytes(rows, 1, h, ep, 1, 8)
    a2a = calc.comm.ep_layer_bytes(rows, 1, h, ep, 1, 8)["all_to_all"]
    etp = calc.comm.expert_tp_layer_bytes(rows, 1, h, tp, 1, 8)
    for r in range(world):
        assert _bytes(res, r, "ep", "all_to_all") == STEPS * m * 2 * a2a, r
        assert _bytes(res, r, "etp_ep", "all_gather") == 0.0   # static splits: nothing exchanged
        for op in ("all_gather", "reduce_scatter"):
            assert _bytes(res, r, "etp", op) == STEPS * m * 2 * etp[op], (r, op)


def test_allgather_dispatcher_bytes_equal_calc(trained):
    name, kw, res, _ = trained
    if not name.startswith("ep2 allgather"):
        pytest.skip("the all-gather layout")
    m = kw["global_batch_size"] // (kw["micro_batch_size"] * 2)
    want = calc.comm.ep_allgather_layer_bytes(kw["seq_length"], kw["micro_batch_size"], kw["hidden_size"],
                                              kw["num_experts"], 2, 8)
    for r in range(2):
        for op in ("all_gather", "reduce_scatter"):
            assert _bytes(res, r, "etp_ep", op) == STEPS * m * 2 * want[op], (r, op)


def test_dropless_alltoall_bytes_follow_the_routed_rows():
    """One step, EP 4 dropless: each rank's bytes are 2 (rows out + rows in) h per layer and
    microbatch, the rows from the single-device model routing the same microbatches. (The step
    equals one device's too: loss and every gradient.)"""
    kw = dict(MOE, expert_model_parallel_size=4, **A2A)
    res = labkit.train(world_size=4, steps=1, log_interval=0, capture_grads=True, **kw)
    ref = train_reference(world_size=4, steps=1, capture_grads=True, **kw)
    assert res.losses[0] == pytest.approx(ref["losses"][0], rel=0, abs=1e-11)
    for pname, g in ref["grads"].items():
        assert_close(res.grads[pname], g, **GRAD, msg=pname)
    counts = routed_counts(4, **kw)
    want = expected_alltoall_bytes(counts, kw["num_experts"], 4, kw["hidden_size"], 8)
    assert kw["global_batch_size"] == 4 * kw["micro_batch_size"]          # one microbatch per rank
    balanced = 2 * calc.comm.ep_layer_bytes(kw["seq_length"], kw["micro_batch_size"], kw["hidden_size"],
                                            4, 2, 8)["all_to_all"]        # 2 MoE layers
    got = [_bytes(res, r, "ep", "all_to_all") for r in range(4)]
    assert got == want
    assert got != [balanced] * 4                     # the router is not balanced: it shows
    exchange = 2 * 3 * kw["num_experts"] * 8         # split sizes first: E int64 counts to 3 peers
    assert [_bytes(res, r, "etp_ep", "all_gather") for r in range(4)] == [exchange] * 4


def test_memory_per_rank_equals_calc_for_ep_1_2_4():
    base = dict(MOE, params_dtype="float32", use_distributed_optimizer=True, global_batch_size=8,
                micro_batch_size=2, moe_ffn_hidden_size=48)
    configs = [dict(base, expert_model_parallel_size=ep, **A2A) for ep in (1, 2, 4)]
    out = labkit.launch(memory_worker, 4, configs)
    for cfg_kw, ep in zip(configs, (1, 2, 4)):
        model, par = labkit.config.train_config(**cfg_kw).megatron_view(4)
        want = calc.memory_per_stage(model, par, calc.FP32)[0]
        counts = calc.stage_params(model, par, 0)
        for r, rank in enumerate(out):
            held = rank[(1, 2, 4).index(ep)]
            assert (held["dense_params"], held["expert_params"]) == (counts["dense"], counts["expert"])
            assert held["dense_params"] % par.dp == 0 and held["expert_params"] % par.edp == 0  # no padding
            for k in ("params", "grads", "optimizer"):
                assert held[k] == want[k], (ep, r, k, held[k], want[k])


@pytest.mark.gpu(devices=2)
@pytest.mark.parametrize("dispatcher", [A2A, AG])
def test_nccl_expert_parallel_equals_one_device(dispatcher):
    """On a GPU node (NCCL, one rank per GPU): EP 2 with capacity and padding, float64, equals the
    single-device reference (losses and every gradient after step 1)."""
    kw = dict(MOE, expert_model_parallel_size=2, moe_expert_capacity_factor=1.0,
              moe_pad_expert_input_to_capacity=True, **dispatcher)
    res = labkit.train(world_size=2, steps=3, backend="nccl", log_interval=0, capture_grads=True, **kw)
    ref = train_reference(world_size=2, steps=3, capture_grads=True, **kw)
    assert_close(torch.tensor(res.losses), torch.tensor(ref["losses"]), rtol=1e-10, atol=1e-10)
    for pname, g in ref["grads"].items():
        assert_close(res.grads[pname].cpu(), g, rtol=1e-9, atol=1e-10, msg=pname)

"""Tier 2 (gloo ranks): context parallelism equals one device, layer by layer and over training.

Issue "Context parallelism". One launch of 4 ranks cuts one TransformerLayer (float64, every
parameter random) for CP 2 and 4, each comm type ("p2p" ring, "all_gather", "a2a"), the ring also
on the contiguous split: output, input gradient and every weight gradient (summed over the CP
group) equal the dense layer within 1e-12; the bytes of the forward and of the backward equal
``labkit.calc.comm.cp_attention_bytes`` exactly; the saved activations equal the itemized count.
Then ``labkit.train`` (5 steps, float64) against ``labkit.reference``: every comm type at CP 2
and 4, and CP composed with DP (with the distributed optimizer), TP + SP and PP, as
tests/test_composition.py compares layouts.
"""
from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

import labkit
from labkit.calc.comm import cp_attention_bytes
from labkit.measure.context_parallel import VARIANTS, block_parity, itemized_activation_bytes
from labkit.reference import train_reference

S, B, H, A = 16, 2, 32, 4                     # block_parity's layer (float64: 8 bytes an element)
MODEL = dict(num_layers=2, hidden_size=32, num_attention_heads=4, seq_length=16, params_dtype="float64")
GRAD = dict(rtol=1e-12, atol=1e-12)


@pytest.fixture(scope="module")
def layer():
    return block_parity(VARIANTS, S, H, A, B)


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: f"cp{v[0]}-{v[1]}-{v[2]}")
def test_one_layer_output_and_every_gradient_equal_the_dense_layer(layer, variant):
    ranks = layer[variant]
    assert len(ranks) == variant[0]
    for r, res in enumerate(ranks):
        assert len(res["pairs"]) == 2 + 12                 # output, input grad, 12 parameters
        for what, (got, want) in res["pairs"].items():
            assert_close(got, want, **GRAD, msg=lambda m: f"{variant}, rank {r}, {what}: {m}")


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: f"cp{v[0]}-{v[1]}-{v[2]}")
def test_bytes_of_forward_and_backward_equal_labkit_calc(layer, variant):
    cp, kind, _ = variant
    calc = cp_attention_bytes(S, B, H, cp, 8, kind, hidden_size=H)
    for r, res in enumerate(layer[variant]):
        assert res["forward"] == calc["forward"], (variant, r)
        assert res["backward"] == calc["backward"], (variant, r)


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: f"cp{v[0]}-{v[1]}-{v[2]}")
def test_saved_activations_equal_the_itemized_count(layer, variant):
    cp, kind, _ = variant
    want = sum(itemized_activation_bytes(S, B, H, A, cp, kind).values())
    assert [res["saved_bytes"] for res in layer[variant]] == [want] * cp


def test_ring_work_is_balanced_only_under_the_load_balanced_split(layer):
    for cp in (2, 4):
        bal = [r["work"]["blocks"] for r in layer[(cp, "p2p", "balanced")]]
        con = [r["work"]["blocks"] for r in layer[(cp, "p2p", "contiguous")]]
        # forward and backward each compute 2c+1 blocks per rank balanced, 4r+3 on rank r contiguous
        assert bal == [2 * (2 * cp + 1)] * cp
        assert con == [2 * (4 * r + 3) for r in range(cp)]


LAYOUTS = {  # name: (world size, layout); global batch 4, micro batch 2
    "cp2 p2p": (2, dict(context_parallel_size=2)),
    "cp4 p2p": (4, dict(context_parallel_size=4)),
    "cp4 all_gather": (4, dict(context_parallel_size=4, cp_comm_type="all_gather")),
    "cp4 a2a": (4, dict(context_parallel_size=4, cp_comm_type="a2a")),
    "cp2 all_gather dp2 zero1": (4, dict(context_parallel_size=2, cp_comm_type="all_gather",
                                         use_distributed_optimizer=True)),   # shards over dp x cp = 4
    "cp2 a2a tp2 sp": (4, dict(context_parallel_size=2, cp_comm_type="a2a", tensor_model_parallel_size=2,
                               sequence_parallel=True)),
    "cp2 p2p pp2": (4, dict(context_parallel_size=2, pipeline_model_parallel_size=2)),
}


@pytest.fixture(scope="module", params=sorted(LAYOUTS))
def trained(request):
    world, layout = LAYOUTS[request.param]
    kw = dict(MODEL, micro_batch_size=2, global_batch_size=4, **layout)
    res = labkit.train(world_size=world, steps=5, log_interval=0, capture_grads=True, **kw)
    ref = train_reference(world_size=world, steps=5, capture_grads=True, **kw)
    return request.param, res, ref


def test_losses_grad_norms_and_every_gradient_equal_one_device(trained):
    name, res, ref = trained
    assert_close(torch.tensor(res.losses), torch.tensor(ref["losses"]), rtol=0, atol=1e-11, msg=name)
    assert_close(torch.tensor(res.grad_norms), torch.tensor(ref["grad_norms"]), rtol=1e-11, atol=0, msg=name)
    assert set(res.grads) == set(ref["grads"]), name
    for pname, g in ref["grads"].items():
        assert_close(res.grads[pname], g, **GRAD, msg=lambda m: f"{name}, {pname}: {m}")


def test_the_cp_group_carried_the_attention_traffic(trained):
    name, res, _ = trained
    op = {"p2p": "send_recv", "all_gather": "all_gather", "a2a": "all_to_all"}[name.split()[1]]
    assert all(r["comm"]["cp"][op]["calls"] > 0 for r in res.ranks), name


def test_cli_trains_with_context_parallel_flags(capsys):
    from labkit.__main__ import main
    argv = ["train", "--world-size", "2", "--train-iters", "2", "--context-parallel-size", "2",
            "--cp-comm-type", "all_gather", "--num-layers", "2", "--hidden-size", "32", "--seq-length", "16",
            "--micro-batch-size", "2", "--params-dtype", "float64", "--log-interval", "0"]
    assert main(argv) == 0
    want = train_reference(world_size=2, steps=2, context_parallel_size=2, cp_comm_type="all_gather",
                           micro_batch_size=2, **MODEL)[-1]
    assert f"final lm loss: {want:.6f}" in capsys.readouterr().out


@pytest.mark.gpu(devices=2)
def test_one_layer_on_nccl_equals_the_dense_layer():
    res = block_parity([(2, "p2p", "balanced"), (2, "all_gather", "balanced"), (2, "a2a", "balanced")],
                       S, H, A, B, backend="nccl")
    for variant, ranks in res.items():
        for r, out in enumerate(ranks):
            for what, (got, want) in out["pairs"].items():
                assert_close(got, want, **GRAD, msg=lambda m: f"{variant}, rank {r}, {what}: {m}")

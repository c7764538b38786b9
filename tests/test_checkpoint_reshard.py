"""Resharding parity: a checkpoint saved under one layout continues exactly under another.

Issue 22, "Done when". float64, dropout off. A chain of runs, each loading the checkpoint the
previous one saved, under another layout and often another world size; every loaded run's losses
and gradient norms, and every parameter's gradient at its first iteration (reassembled to dense
names), equal the uninterrupted single-device run (``labkit.reference``) at the same iterations:

    tp2 pp2 dp2 ZeRO-1 (8) --2--> tp4 (4) --5--> pp2 vpp2 dp2 ZeRO-1 (4) --6--> tp2 dp2 sp ZeRO-3 (4)
          \\--2--> one rank (1)                                       --7--> cp2 dp2 ZeRO-2 (4)
    MoE   ep2 (2) --2--> tp2 sp, experts cut over etp 2 (2)
    Llama (GQA, SwiGLU)  tp2 (2) --2--> tp4 (4): each K/V group shared by two ranks

Each arrow is a pair (from layout -> to layout): 8 pairs, with the distributed optimizer's shards
(ZeRO-1/2/3, saved in model space), VPP, CP and EP among them. The Megatron vocabulary padding
(a multiple of make_vocab_size_divisible_by x TP) must agree across a pair: 64 here.
"""
from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

import labkit
from labkit.config import preset_args
from labkit.debug import GradHistory
from labkit.reference import train_reference

BASE = dict(params_dtype="float64", micro_batch_size=2, global_batch_size=8, make_vocab_size_divisible_by=64)
DENSE = dict(BASE, num_layers=4, hidden_size=32, num_attention_heads=4, seq_length=16)
MOE = dict(BASE, num_layers=2, hidden_size=32, num_attention_heads=4, seq_length=16, num_experts=4,
           moe_router_topk=2)
LLAMA = dict(BASE, **preset_args("llama3-tiny"))

# (name, model, world, layout, load from (name) or None, steps): runs in this order
CHAIN = [
    ("tp2 pp2 dp2 zero1", DENSE, 8, dict(tensor_model_parallel_size=2, pipeline_model_parallel_size=2,
                                         use_distributed_optimizer=True), None, 2),
    ("tp4", DENSE, 4, dict(tensor_model_parallel_size=4), "tp2 pp2 dp2 zero1", 5),
    ("one rank", DENSE, 1, {}, "tp2 pp2 dp2 zero1", 5),
    ("pp2 vpp2 dp2 zero1", DENSE, 4, dict(pipeline_model_parallel_size=2, num_layers_per_virtual_pipeline_stage=1,
                                          use_distributed_optimizer=True), "tp4", 6),
    ("tp2 dp2 sp zero3", DENSE, 4, dict(tensor_model_parallel_size=2, sequence_parallel=True, zero_stage=3),
     "pp2 vpp2 dp2 zero1", 7),
    ("cp2 dp2 zero2", DENSE, 4, dict(context_parallel_size=2, zero_stage=2), "tp2 dp2 sp zero3", 8),
    ("moe ep2", MOE, 2, dict(expert_model_parallel_size=2), None, 2),
    ("moe tp2 sp etp2", MOE, 2, dict(tensor_model_parallel_size=2, sequence_parallel=True), "moe ep2", 4),
    ("llama tp2", LLAMA, 2, dict(tensor_model_parallel_size=2), None, 2),
    ("llama tp4", LLAMA, 4, dict(tensor_model_parallel_size=4), "llama tp2", 4),
]


@pytest.fixture(scope="module")
def chain(tmp_path_factory):
    """{name: (TrainResult, its first iteration)} for every run of CHAIN, and the references."""
    root = tmp_path_factory.mktemp("reshard")
    out, refs = {}, {}
    for name, model, world, layout, source, steps in CHAIN:
        load = None if source is None else root / source
        out[name] = labkit.train(world_size=world, steps=steps, log_interval=0, capture_grads=True,
                                 save=root / name, load=load, **model, **layout)
        key = id(model)
        if key not in refs:
            refs[key] = train_reference(world_size=1, steps=max(s for _, m, *_, s in CHAIN if m is model),
                                        probe=GradHistory, **model)
    return {name: (out[name], refs[id(model)], source) for name, model, *_, source, _ in CHAIN}


@pytest.mark.parametrize("name", [c[0] for c in CHAIN])
def test_continues_exactly_like_one_device(chain, name):
    res, ref, source = chain[name]
    start = res.ranks[0]["start"]
    assert start == (0 if source is None else chain[source][0].ranks[0]["start"] + len(chain[source][0].losses))
    end = start + len(res.losses)
    assert_close(torch.tensor(res.losses), torch.tensor(ref["losses"][start:end]), rtol=0, atol=1e-11,
                 msg=f"{source} -> {name}: losses of iterations {start + 1}-{end}")
    assert_close(torch.tensor(res.grad_norms), torch.tensor(ref["grad_norms"][start:end]), rtol=1e-11, atol=0)
    want = ref["probe"][start]                          # every gradient at the first iteration here
    assert set(res.grads) == set(want)
    for pname, g in want.items():
        assert_close(res.grads[pname], g, rtol=1e-11, atol=1e-12, msg=lambda m: f"{source} -> {name}, {pname}: {m}")


def test_the_chain_changes_what_it_claims():
    """Every loading run differs from its source in layout, and the pairs cover the distributed
    optimizer, VPP, CP and EP on one side at least (so a renamed layout cannot pass silently)."""
    runs = {c[0]: c for c in CHAIN}
    pairs = [(runs[c[4]], c) for c in CHAIN if c[4] is not None]
    assert len(pairs) >= 6
    assert all(a[3] != b[3] for a, b in pairs)
    sides = [dict(a[3], **b[3]) for a, b in pairs]
    for knob in ("use_distributed_optimizer", "num_layers_per_virtual_pipeline_stage", "context_parallel_size",
                 "expert_model_parallel_size", "zero_stage"):
        assert any(knob in s for s in sides), knob
    assert any(a[2] != b[2] for a, b in pairs), "some pair changes the world size"

"""Tier 2: PyTorch-native runs with gradient accumulation (more than one microbatch per step).

Issue 31's first finding: every ``implementation="native"`` run whose global batch is above
``micro_batch_size * dp`` died with an IndexError inside ``CommDebugMode`` (its module tracker
pops a parent it never pushed on the second forward); the native tests only ran one microbatch.
Here TP + SP and FSDP2 each accumulate over 2 microbatches and train like one device in float64
(losses of 2 steps, every gradient after step 1), and CommDebugMode still counts the calls the
byte counter counts.
"""
from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

import labkit
from labkit.reference import train_reference

MODEL = dict(num_layers=2, hidden_size=16, num_attention_heads=2, seq_length=8, params_dtype="float64")


@pytest.mark.parametrize("layout", [
    dict(tensor_model_parallel_size=2, sequence_parallel=True, global_batch_size=4),   # m = 2
    dict(zero_stage=3, global_batch_size=8),                                          # FSDP2, dp 2, m = 2
], ids=["tp-sp", "fsdp2"])
def test_native_accumulates_microbatches_like_one_device(layout):
    kw = {**MODEL, **layout}
    run = labkit.train(world_size=2, steps=2, log_interval=0, capture_grads=True, implementation="native", **kw)
    ref = train_reference(world_size=2, steps=2, capture_grads=True, **kw)
    assert run.config.num_microbatches(run.config.topology(2)) == 2
    assert_close(torch.tensor(run.losses), torch.tensor(ref["losses"]), rtol=1e-11, atol=1e-11)
    assert set(run.grads) == set(ref["grads"])
    for name, g in ref["grads"].items():
        assert_close(run.grads[name].double(), g, rtol=1e-12, atol=1e-12, msg=name)
    counted = {op: v["calls"] for axis in run.ranks[0]["comm"].values() for op, v in axis.items()}
    debug = {}
    for k, v in run.ranks[0]["comm_debug"].items():
        op = k.split(".")[-1].replace("_into_tensor", "").replace("_tensor", "").rstrip("_")
        op = {"allreduce": "all_reduce", "_allgather_base": "all_gather", "_reduce_scatter_base": "reduce_scatter"}.get(op, op)
        debug[op] = debug.get(op, 0) + v
    assert sum(debug.values()) == sum(counted.values()) > 0, (debug, counted)

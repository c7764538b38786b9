"""The GPU node path: NCCL, one rank per GPU. Every test here is marked ``gpu`` (skipped on a CPU
machine by tests/conftest.py, with the number of GPUs it needs) and names backend="nccl" itself.

None of these has run yet on this project's machines (no GPU was available); ``python -m labkit
gpu-check`` runs them on a GPU node and writes a report. What they would catch:
* a pipeline p2p pattern that deadlocks on NCCL once activations are large (16 MiB and more: NCCL
  completes small sends eagerly, large ones only when the receive is posted);
* CPU tensors handed to NCCL, CUDA tensors returned to the caller, TF32 under fp32 tolerances;
* the composed layouts (TP x PP, TP + SP x DP, ZeRO-3) on real devices.
"""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

import labkit
from labkit.reference import train_reference

SMALL = dict(num_layers=4, hidden_size=32, num_attention_heads=4, seq_length=16, micro_batch_size=2,
             global_batch_size=8)


def _gpus() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


@pytest.mark.gpu(devices=4)
def test_pp2_tp2_on_nccl_equals_one_device():
    """Issue 9: TP x PP on NCCL. fp32 on GPU with TF32 off (the launcher's default) vs the CPU
    reference: cuBLAS sums in another order, so 1e-4 on losses of ~5."""
    for extra in ({}, {"sequence_parallel": True, "num_layers_per_virtual_pipeline_stage": 1}):
        kw = dict(SMALL, tensor_model_parallel_size=2, pipeline_model_parallel_size=2, **extra)
        got = labkit.train(world_size=4, steps=5, backend="nccl", log_interval=0, **kw)
        ref = train_reference(world_size=4, steps=5, **kw)
        torch.testing.assert_close(torch.tensor(got.losses), torch.tensor(ref), rtol=0, atol=1e-4)


@pytest.mark.gpu(devices=2)
@pytest.mark.parametrize("pp,per_virtual", [(2, None), (2, 2), (4, None)])
def test_pipeline_with_large_activations_does_not_deadlock(pp, per_virtual):
    """Activations of [4, 1024, 1024] fp32 = 16 MiB per message: NCCL's rendezvous regime. The
    pipeline's losses equal the same model on one GPU."""
    if _gpus() < pp:
        pytest.skip(f"needs {pp} GPUs, found {_gpus()}")
    kw = dict(num_layers=8, hidden_size=1024, num_attention_heads=8, seq_length=1024, micro_batch_size=4,
              global_batch_size=16)
    one = labkit.train(world_size=1, steps=2, backend="nccl", log_interval=0, **kw)
    got = labkit.train(world_size=pp, steps=2, backend="nccl", log_interval=0, timeout=600,
                       pipeline_model_parallel_size=pp, num_layers_per_virtual_pipeline_stage=per_virtual, **kw)
    torch.testing.assert_close(torch.tensor(got.losses), torch.tensor(one.losses), rtol=0, atol=1e-4)


@pytest.mark.gpu(devices=8)
@pytest.mark.parametrize("layout", [dict(tensor_model_parallel_size=2, sequence_parallel=True),
                                    dict(tensor_model_parallel_size=2, sequence_parallel=True, zero_stage=3)],
                         ids=["tp2-sp-dp4", "tp2-sp-dp4-zero3"])
def test_world_8_tp_sp_dp_and_zero3(layout):
    kw = dict(SMALL, global_batch_size=16, **layout)
    got = labkit.train(world_size=8, steps=5, backend="nccl", log_interval=0, **kw)
    ref = train_reference(world_size=8, steps=5, **kw)
    torch.testing.assert_close(torch.tensor(got.losses), torch.tensor(ref), rtol=0, atol=1e-4)


def _single_step():
    import torch

    from labkit import data
    from labkit.config import TrainConfig
    from labkit.launcher import device, timer
    from labkit.training import build_rank, rank_microbatches
    cfg = TrainConfig(zero_stage=3, **SMALL)
    topo, _, engine = build_rank(cfg, 0)
    on_gpu = all(p.device == device() and p.device.type == "cuda" for c in engine.runner.chunks
                 for p in c.parameters())
    mbs = rank_microbatches(cfg, topo, 0, 0, data.load_tokens())
    with timer() as t:
        loss, _ = engine.step(mbs)
    freed = all(u.flat.untyped_storage().nbytes() == 0 for u in engine.dp.members[0].units)  # ZeRO-3
    return {"on_gpu": on_gpu, "freed": freed, "loss": loss, "seconds": t.seconds,
            "tf32": torch.backends.cuda.matmul.allow_tf32}


def test_the_single_gpu_step_runs_on_a_cpu_rank():
    """The GPU test's step, on a gloo rank: what it reads of labkit (ZeRO-3's units) stays current."""
    [got] = labkit.launch(_single_step, 1, backend="gloo")
    assert not got["on_gpu"] and got["freed"]
    assert abs(got["loss"] - train_reference(steps=1, zero_stage=3, **SMALL)[0]) < 1e-5


@pytest.mark.gpu(devices=1)
def test_world_size_1_on_one_gpu():
    """Placement, ZeRO-3 freeing its storage, TF32 off, fp32 GPU vs CPU parity, a real step time."""
    [got] = labkit.launch(_single_step, 1, backend="nccl")
    assert got["on_gpu"] and got["freed"] and got["tf32"] is False
    ref = train_reference(steps=1, zero_stage=3, **SMALL)
    assert abs(got["loss"] - ref[0]) < 1e-5
    assert got["seconds"] > 0
    print(f"one ZeRO-3 step of the small GPT on one GPU: {got['seconds'] * 1e3:.1f} ms")


@pytest.mark.gpu(devices=8)
def test_torchrun_with_8_processes():
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "8",
           "-m", "labkit", "train", "--micro-batch-size", "2", "--global-batch-size", "16",
           "--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2", "--num-layers", "4",
           "--train-iters", "3", "--backend", "nccl"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600,
                         env=dict(os.environ, LABKIT_BACKEND="nccl"))
    assert out.returncode == 0, out.stderr[-3000:]
    assert sum(line.startswith(" iteration") for line in out.stdout.splitlines()) == 3

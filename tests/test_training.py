"""labkit.train: validation before launch, DP parity with the independent single-device loop,
Megatron-format logs, the command line and torchrun."""
import os
import re
import subprocess
import sys

import pytest
import torch

import labkit
from labkit.reference import train_reference
from labkit.config import TrainConfig
from labkit.training import format_iteration

# fp32: parallel runs sum the same numbers in another order (microbatches, ranks), so losses
# differ in the last bits; 1e-6 relative is ~8 float32 ulps at loss ~5.5. float64: 1e-12.
FP32 = dict(rtol=1e-6, atol=1e-6)
FP64 = dict(rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("world,mbs,gbs,backend", [
    (1, 2, 8, "gloo"), (2, 4, 8, "gloo"), (2, 2, 8, "gloo"), (4, 1, 8, "gloo"),
    pytest.param(2, 2, 8, "nccl", marks=pytest.mark.gpu(devices=2)),  # GPU math: fp32 TF32-free
])
def test_data_parallel_losses_equal_single_device(world, mbs, gbs, backend):
    cfg = dict(micro_batch_size=mbs, global_batch_size=gbs)
    ref = train_reference(steps=5, **cfg)
    got = labkit.train(world_size=world, steps=5, log_interval=0, backend=backend, **cfg)
    assert len(got.losses) == 5
    torch.testing.assert_close(torch.tensor(got.losses), torch.tensor(ref), **FP32)
    assert got.losses[-1] < got.losses[0]  # it learns


def test_float64_parity_is_exact_to_1e12():
    cfg = dict(micro_batch_size=1, global_batch_size=4, params_dtype="float64")
    ref = train_reference(steps=3, **cfg)
    got = labkit.train(world_size=2, steps=3, log_interval=0, **cfg)
    torch.testing.assert_close(torch.tensor(got.losses, dtype=torch.float64),
                               torch.tensor(ref, dtype=torch.float64), **FP64)


@pytest.mark.parametrize("kwargs,msg", [
    (dict(world_size=4, micro_batch_size=3, global_batch_size=8), "global_batch_size divisible by micro_batch_size \\* DP; 8 % \\(3 \\* 4\\)"),
    (dict(world_size=4, tensor_model_parallel_size=3), "world_size divisible by TP\\*PP\\*CP; 4 is not divisible by 3\\*1\\*1"),
    (dict(world_size=2, num_attention_heads=5, hidden_size=60, tensor_model_parallel_size=2), "num_attention_heads divisible by TP; 5 % 2"),
    (dict(world_size=1, ddp_bucket_size=0), "ddp_bucket_size must be a positive integer, got 0"),
    (dict(world_size=1, zero_stage=4), "zero_stage must be 0, 1, 2 or 3"),
    (dict(world_size=1, micro_batch_size=0), "micro_batch_size must be a positive integer"),
    (dict(world_size=1, hidden_sizee=64), "unknown configuration \\['hidden_sizee'\\]"),
    (dict(world_size=0), "world_size must be a positive integer"),
    (dict(world_size=1, steps=0), "steps must be a positive integer"),
])
def test_bad_configs_fail_before_any_process(kwargs, msg, monkeypatch):
    import labkit.launcher
    monkeypatch.setattr(labkit.launcher, "launch", lambda *a, **k: pytest.fail("launched"))
    with pytest.raises(ValueError, match=msg):
        labkit.train(**kwargs)


def test_megatron_log_line_format():
    line = format_iteration(3, 10, 24, 12.34, 1e-3, 8, 5.5, 1.25)
    assert line == (" iteration        3/      10 | consumed samples:           24 | elapsed time per "
                    "iteration (ms): 12.3 | learning rate: 1.000000E-03 | global batch size:     8 | "
                    "lm loss: 5.500000E+00 | loss scale: 1.0 | grad norm: 1.250 | number of skipped "
                    "iterations:   0 | number of nan iterations:   0 |")


def test_logs_stream_to_caller_and_grad_norm_matches_dense(capsys):
    res = labkit.train(world_size=2, steps=2, micro_batch_size=2, global_batch_size=4)
    lines = [l for l in capsys.readouterr().out.splitlines() if "iteration" in l]
    assert len(lines) == 2 and "iteration        2/       2" in lines[1]
    assert f"lm loss: {res.losses[1]:.6E}" in lines[1]
    # grad norm of iteration 1 equals the dense model's on the same global batch
    from labkit import data
    from labkit.model import GPT
    m = GPT(TrainConfig().model_config(), seed=0)
    x, y = data.get_batch(data.load_tokens(), 0, 4, 64, 0)
    m.loss(x, y).backward()
    dense = torch.sqrt(sum(p.grad.double().pow(2).sum() for p in m.parameters())).item()
    assert abs(res.grad_norms[0] - dense) < 1e-5 * dense


def test_command_line_train(tmp_path):
    cmd = [sys.executable, "-m", "labkit", "train", "--world-size", "2", "--micro-batch-size", "2",
           "--global-batch-size", "8", "--train-iters", "3"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = [l for l in out.stdout.splitlines() if l.startswith(" iteration")]
    assert len(lines) == 3
    losses = [float(re.search(r"lm loss: (\S+) \|", l).group(1)) for l in lines]
    ref = train_reference(steps=3, micro_batch_size=2, global_batch_size=8)
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref), rtol=1e-6, atol=1e-6)  # printed with 7 digits
    bad = subprocess.run(cmd[:-2] + ["--global-batch-size", "7"], capture_output=True, text=True, timeout=180)
    assert bad.returncode == 2 and "global_batch_size divisible by" in bad.stderr and "Traceback" not in bad.stderr
    zero = subprocess.run(cmd[:4] + ["--world-size", "0"], capture_output=True, text=True, timeout=180)
    assert zero.returncode == 2 and "world_size must be a positive integer, got 0" in zero.stderr


def test_command_line_under_torchrun():
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "-m", "labkit", "train", "--micro-batch-size", "2", "--global-batch-size", "8", "--train-iters", "2"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert out.returncode == 0, out.stderr[-2000:]
    lines = [l for l in out.stdout.splitlines() if l.startswith(" iteration")]
    assert len(lines) == 2  # printed once (rank 0), not once per rank
    losses = [float(re.search(r"lm loss: (\S+) \|", l).group(1)) for l in lines]
    ref = train_reference(steps=2, micro_batch_size=2, global_batch_size=8)
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref), rtol=1e-6, atol=1e-6)

"""Failing safely before and after the launch (issue 24): what can be checked is refused before any
process starts, as one line naming the argument; an error raised inside a rank reaches the command
line as one line naming the rank (the traceback under --verbose)."""
import math
import sys

import cloudpickle
import pytest

import labkit
from labkit import preflight
from labkit.__main__ import main
from labkit.config import TrainConfig

cloudpickle.register_pickle_by_value(sys.modules[__name__])
NAN, INF = float("nan"), float("inf")


@pytest.fixture
def no_process(monkeypatch):
    """Any attempt to start a rank fails the test."""
    monkeypatch.setattr(labkit.launcher.mp, "get_context", lambda *a: pytest.fail("a process was started"))


@pytest.mark.parametrize("argv, message", [
    (["--lr", "inf"], "lr must be a finite number, got inf"),
    (["--lr", "nan"], "lr must be a finite number, got nan"),
    (["--lr", "-1"], "lr must be > 0, got -1.0"),
    (["--adam-beta1", "1"], "adam_beta1 must be in [0, 1), got 1.0"),
    (["--adam-beta2", "-0.5"], "adam_beta2 must be in [0, 1), got -0.5"),
    (["--weight-decay", "nan"], "weight_decay must be a finite number, got nan"),
    (["--clip-grad", "-1"], "clip_grad must be >= 0, got -1.0"),
    (["--adam-eps", "0"], "adam_eps must be > 0, got 0.0"),
    (["--seed", "-3"], "seed must be an integer in [0, 2**32), got -3"),
    (["--timeout", "nan"], "timeout must be a finite number of seconds > 0, got nan"),
    (["--timeout", "inf"], "timeout must be a finite number of seconds > 0, got inf"),
    (["--seq-length", "1000000"], "seq_length 1000000: the corpus has 101640 tokens"),
    (["--micro-batch-size", "100000"], "world_size 2: 2 ranks need at least"),
    (["--hidden-size", "1000000"], "world_size 2: 2 ranks need at least"),
    (["--world-size", "10000"], "world_size 10000: 10000 ranks need at least"),
    (["--moe-layer-freq", "[1]*10**8", "--num-experts", "4"], "moe_layer_freq: only integers, lists"),
])
def test_cli_refuses_before_launching_in_one_line(argv, message, capsys, no_process):
    assert main(["train", "--world-size", "2", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and err.count("\n") == 1, err


def test_memory_refusal_names_ranks_and_both_sizes(capsys, no_process):
    cfg = TrainConfig(micro_batch_size=100000)
    per_rank = preflight.rank_memory_bytes(cfg, 2) / 2 ** 20
    assert main(["train", "--world-size", "2", "--micro-batch-size", "100000"]) == 2
    err = capsys.readouterr().err
    assert f"+ {per_rank:,.0f} MiB of parameters, gradients, optimizer states and activations" in err
    assert "GiB this machine has available" in err


@pytest.mark.parametrize("kwargs, message", [
    (dict(sequence_parallel="no"), r"^sequence_parallel must be True or False, got 'no' \(str\)"),
    (dict(use_distributed_optimizer=1), r"^use_distributed_optimizer must be True or False, got 1"),
    (dict(hidden_size=64.0), r"^hidden_size must be an integer, got 64\.0"),
    (dict(clip_grad=NAN), r"^clip_grad must be a finite number, got nan"),
    (dict(clip_grad=-1), r"^clip_grad must be >= 0, got -1"),
    (dict(lr=INF), r"^lr must be a finite number, got inf"),
    (dict(lr="1e-3"), r"^lr must be a number, got '1e-3'"),
    (dict(log_interval=1.5), r"^log_interval must be an integer >= 0"),
    (dict(seed=1.5), r"^seed must be an integer in \[0, 2\*\*32\)"),
    (dict(seed=True), r"^seed must be an integer"),
    (dict(timeout=NAN), r"^timeout must be a finite number of seconds > 0, got nan"),
    (dict(data_path=None, seq_length=200000), r"^seq_length 200000: the corpus has 101640 tokens"),
])
def test_python_api_refuses_each_by_name(kwargs, message, no_process):
    with pytest.raises(ValueError, match=message):
        labkit.train(world_size=1, steps=1, **kwargs)


def test_every_check_can_pass():
    cfg = TrainConfig(lr=1, clip_grad=1.0, weight_decay=0, adam_beta1=0.0, sequence_parallel=False)
    cfg.validate(1)
    assert preflight.preflight(cfg, 1, seed=2 ** 32 - 1, log_interval=0) == preflight.rank_memory_bytes(cfg, 1)
    assert math.isfinite(preflight.rank_memory_bytes(cfg, 1)) and preflight.data_tokens(cfg) == 101640


def _boom():
    import torch.distributed as dist
    if dist.get_rank() == 1:
        raise ValueError("corpus of 10 tokens is too short, on purpose")
    dist.barrier()


@pytest.fixture
def failing_ranks(monkeypatch):
    """labkit.train's launch runs _boom on the ranks instead of the training (a real rank failure)."""
    real = labkit.launcher.launch

    def launch(fn, world_size, *args, **kwargs):
        keep = {k: kwargs[k] for k in ("backend", "timeout", "rank_memory_bytes") if k in kwargs}
        return real(_boom, world_size, **keep)
    monkeypatch.setattr(labkit.launcher, "launch", launch)


def test_a_rank_error_is_one_line_naming_the_rank(failing_ranks, capsys):
    assert main(["train", "--world-size", "2", "--train-iters", "1"]) == 1
    err = capsys.readouterr().err
    assert err == ("error: rank 1 failed: ValueError: corpus of 10 tokens is too short, on purpose "
                   "(--verbose: traceback and output)\n")
    assert main(["train", "--world-size", "2", "--train-iters", "1", "--verbose"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: rank 1 failed: ValueError: corpus of 10 tokens")
    assert err.count("Traceback (most recent call last)") == 1          # once, not twice
    assert "captured output of rank 1" in err


def test_experiments_run_checks_the_output_folder_first(monkeypatch, capsys):
    from labkit.experiments.cli import main as experiments
    monkeypatch.setattr(labkit.training, "train", lambda **kw: pytest.fail("trained before checking"))
    assert experiments(["run", "train-dp2", "--scale", "cpu", "--outdir", "/proc/nope"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: outdir: cannot write the logs to /proc/nope/train-dp2-gpt2-large-2gpu")

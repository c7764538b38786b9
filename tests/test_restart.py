"""In-job restart (labkit.restart, issue 37): kill ranks mid-run, resume, end bit-identical.

A run with ``max_restarts`` and faults injected on purpose (SIGKILL, SIGTERM, an exception, a
kill during a save) must end with the same losses and gradient norms, iteration by iteration,
and the same final weights, optimizer states, step and RNG states (``torch.equal`` on every value of
the final checkpoint, reassembled by DCP whatever the layout) as the run that never failed; the
iterations recomputed after a restart must repeat the lost ones' losses exactly. A save killed
halfway leaves an ``iter_N.partial`` folder that never loads and the previous checkpoint intact.
The other layouts and the 100-step run with 5 kills: tests/bench_restart.py.
"""
from __future__ import annotations

import math

import pytest

import labkit
from labkit.checkpoint import files
from labkit.restart import Fault, parse_faults, same_state, saved_state

MODEL = dict(num_layers=2, hidden_size=32, num_attention_heads=4, seq_length=16,
             make_vocab_size_divisible_by=64, hidden_dropout=0.1, attention_dropout=0.1)


def _same(a, b) -> bool:
    return len(a) == len(b) and all(x == y or (math.isnan(x) and math.isnan(y)) for x, y in zip(a, b))


def _check_resume(tmp_path, world_size, steps, interval, faults, **config):
    whole = labkit.train(world_size=world_size, steps=steps, log_interval=0, save=tmp_path / "whole", **config)
    hit = labkit.train(world_size=world_size, steps=steps, log_interval=0, save=tmp_path / "hit",
                       save_interval=interval, max_restarts=len(faults), faults=faults, **config)
    assert len(hit.restarts) == len(faults), hit.restarts
    assert [e["rank"] for e in hit.restarts] == [f.rank for f in faults]
    assert hit.goodput["recomputed_losses_equal"] and hit.goodput["recomputed_iterations"] > 0
    assert _same(hit.losses, whole.losses), (hit.losses, whole.losses)
    assert _same(hit.grad_norms, whole.grad_norms)
    a, b = saved_state(tmp_path / "whole"), saved_state(tmp_path / "hit")
    assert any(k.startswith("optimizer.exp_avg.") for k in a) and any(k.startswith("model.") for k in a)
    assert same_state(a, b) == [], "weights / optimizer states / step / RNG differ after the restarts"
    return hit


def test_parse_faults():
    assert parse_faults("1@3, 0@6:save:SIGTERM,2@0:exception") == [
        Fault(1, 3), Fault(0, 6, "save", "SIGTERM"), Fault(2, 0, "step", "exception")]
    for bad in ("1", "a@2", "1@2:later", "-1@2"):
        with pytest.raises(ValueError):
            parse_faults(bad)
    with pytest.raises(ValueError, match="without save"):
        labkit.train(world_size=1, steps=2, max_restarts=1, **MODEL)
    with pytest.raises(ValueError, match="need save"):
        labkit.train(world_size=1, steps=2, faults="0@1", **MODEL)
    from labkit.__main__ import train_parser
    args = vars(train_parser().parse_args(["--max-restarts", "2", "--fault", "1@3:save", "--collective-timeout", "5"]))
    assert (args["max_restarts"], args["fault"], args["collective_timeout"]) == (2, "1@3:save", 5.0)


@pytest.mark.slow
def test_ddp_survives_sigkill_and_an_exception_bit_identical(tmp_path):
    """DDP on 4 ranks, 2 microbatches each, dropout on: SIGKILL of rank 3 before iteration 4 (one
    iteration past the checkpoint at 3), an exception on rank 1 before iteration 5."""
    hit = _check_resume(tmp_path, 4, 6, 3, [Fault(3, 4), Fault(1, 5, "step", "exception")],
                        micro_batch_size=1, global_batch_size=8, **MODEL)
    assert [e["lost_iterations"] for e in hit.restarts] == [1, 2]
    assert "SIGKILL" in hit.restarts[0]["why"] and "injected fault" in hit.restarts[1]["why"]


@pytest.mark.slow
def test_tp_pp_dp_zero1_survives_a_kill_during_a_save_bit_identical(tmp_path):
    """TP2 x PP2 x DP2 with the distributed optimizer (ZeRO-1), 2 microbatches per pipeline, dropout
    on: rank 5 SIGKILLed while writing the checkpoint of iteration 4, rank 2 SIGTERMed before 5."""
    hit = _check_resume(tmp_path, 8, 6, 2, [Fault(5, 4, "save"), Fault(2, 5, "step", "SIGTERM")],
                        tensor_model_parallel_size=2, pipeline_model_parallel_size=2,
                        use_distributed_optimizer=True, micro_batch_size=1, global_batch_size=4, **MODEL)
    assert [e["resumed_from"] for e in hit.restarts] == [2, 4]


def test_a_kill_during_a_save_leaves_no_loadable_checkpoint_and_keeps_the_previous(tmp_path):
    with pytest.raises(labkit.launcher.RankFailed, match="SIGKILL"):
        labkit.train(world_size=2, steps=4, log_interval=0, save=tmp_path, save_interval=2,
                     faults=[Fault(1, 4, "save")], micro_batch_size=2, global_batch_size=8, **MODEL)
    partial = tmp_path / "iter_0000004.partial"
    assert partial.is_dir() and any(partial.glob("*.distcp")), "rank 0 wrote its part before the kill"
    assert not (tmp_path / "iter_0000004").exists()
    assert (tmp_path / files.TRACKER).read_text().strip() == "2"
    with pytest.raises(ValueError, match="unfinished checkpoint"):
        files.verify(partial)
    assert files.verify(files.find(tmp_path)).iteration == 2     # the previous one loads
    rest = labkit.train(world_size=2, steps=4, log_interval=0, load=tmp_path, micro_batch_size=2,
                        global_batch_size=8, **MODEL)
    assert rest.ranks[0]["start"] == 2


@pytest.mark.slow
def test_a_hang_in_a_subgroup_times_out_and_restarts(tmp_path):
    """Rank 1 hangs before iteration 3: rank 0's data-parallel all-reduce (a subgroup, labkit.groups)
    times out after collective_timeout (not PyTorch's 30-minute default for subgroups) and the job
    restarts from the checkpoint at 2, ending as the run that never stopped."""
    kw = dict(MODEL, micro_batch_size=2, global_batch_size=8)
    whole = labkit.train(world_size=2, steps=4, log_interval=0, **kw)
    hit = labkit.train(world_size=2, steps=4, log_interval=0, save=tmp_path, save_interval=2, max_restarts=1,
                       faults="1@3:hang", collective_timeout=5.0, timeout=300, **kw)
    assert len(hit.restarts) == 1 and "timeout" in hit.restarts[0]["why"].lower(), hit.restarts
    assert hit.restarts[0]["detected_s"] < 120
    assert hit.losses == whole.losses

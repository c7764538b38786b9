"""Hangs, aborts and NaNs as the pinned torch really behaves on 2 gloo ranks (labkit.debug).

Issue 22: each hang ends at its timeout (3 s) with labkit.launch's report naming, per rank, the
collective it waits in (faulthandler stack dumps read by labkit/debug/stacks.py); mismatched shapes
abort; a swap returns wrong values at once; TORCH_DISTRIBUTED_DEBUG=DETAIL turns the mismatched op
and shapes into an immediate error; a collective timeout ends the wait and the Flight Recorder's
sequence numbers show which rank is behind; a planted NaN is reported by the rank that made it.
"""
from __future__ import annotations

import pytest

import labkit
from labkit.debug import chain, check_nan, plant_nan, run_hang
from labkit.debug.bugs import MODEL
from labkit.debug.stacks import describe, waits_from_stacks
from labkit.launch_collect import RankFailed


@pytest.fixture(scope="module", autouse=True)
def warm():
    labkit.launch(lambda: 0, 2, backend="gloo")        # the forkserver is up: 3 s are the hang's


@pytest.mark.parametrize("name, waits", [
    ("mismatched_op", {0: "all_reduce", 1: "broadcast"}),
    ("skipped_collective", {0: "all_reduce", 1: "barrier"}),
    ("send_without_recv", {0: "send", 1: "barrier"}),
])
def test_hangs_end_at_the_timeout_naming_each_ranks_collective(name, waits):
    out = run_hang(name, timeout=3.0)
    assert out.kind == "hang", out.report
    assert {r: w["op"] for r, w in out.waits.items()} == waits
    for r, op in waits.items():
        assert f"rank {r} waits in {op} (" in out.report
    assert "debug/hangs.py" in out.waits[0]["site"]


def test_mismatched_shapes_abort_and_a_swap_is_silent():
    out = run_hang("mismatched_shapes")
    assert out.kind == "abort" and "killed by SIGABRT" in out.report
    out = run_hang("swapped")
    assert out.kind == "returned"
    got = {rank: v for kind, rank, v in out.messages if kind == "values"}
    assert got == {0: {"a": 21.0, "b": 12.0}, 1: {"a": 12.0, "b": 21.0}}     # right: a 3, b 30


@pytest.mark.parametrize("name", ["mismatched_op", "mismatched_shapes", "skipped_collective"])
def test_detail_turns_a_mismatch_into_an_immediate_error(name):
    out = run_hang(name, detail=True)
    assert out.kind == "error" and "Detected mismatch between collectives" in out.report


def test_detail_does_not_see_a_swap():
    out = run_hang("swapped", detail=True)
    assert out.kind == "returned" and ("values", 0, {"a": 21.0, "b": 12.0}) in out.messages


def test_collective_timeout_and_flight_recorder_find_the_rank_behind():
    out = run_hang("skipped_collective", collective_timeout=1.5, timeout=20.0, flight_recorder=True)
    assert out.kind == "error" and "Timed out waiting 1500ms" in out.report
    fr = out.flight_recorder()
    last = {rank: entries[-1] for rank, entries in fr.items()}
    assert last[0]["seq"] == last[1]["seq"] and last[0]["op"] == "all_reduce" and last[1]["op"] == "barrier"
    assert all(e["state"] == "scheduled" for entries in fr.values() for e in entries)   # gloo's reading


def test_a_planted_nan_is_found_by_its_rank_and_a_spike_is_logged():
    kw = dict(MODEL, tensor_model_parallel_size=2)
    with pytest.raises(RankFailed) as err:
        labkit.train(world_size=2, steps=3, log_interval=0, probe=chain(plant_nan(1, 2), check_nan()), **kw)
    assert err.value.rank == 1
    assert "Rank 1 (pp 0, tp 1, cp 0, dp 0): found NaN in local grad norm for bucket #0" in err.value.summary
    assert "(iteration 2)" in err.value.summary
    res = labkit.train(world_size=2, steps=3, log_interval=0,
                       probe=chain(plant_nan(0, 3, what="spike"), check_nan()), **kw)
    spikes = [r["probe"][1]["spikes"] for r in res.ranks]
    assert [s["iteration"] for s in spikes[0]] == [3] and spikes[1] == []


DUMP = '''Thread 0x00007f1 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 320 in wait
  File "/x/labkit/launch_rank.py", line 185 in watch

Current thread 0x00007f2 (most recent call first):
  File "/x/site-packages/torch/distributed/distributed_c10d.py", line 3252 in all_reduce
  File "/x/site-packages/torch/distributed/c10d_logger.py", line 83 in wrapper
  File "/x/labkit/comm.py", line 38 in all_reduce
  File "/x/labkit/tensor_parallel/tp_comm.py", line 52 in forward
  File "/x/labkit/launch_rank.py", line 262 in rank_main
'''


def test_stack_dump_parsing():
    w = waits_from_stacks(DUMP)
    assert w == {"op": "all_reduce", "site": "comm.py:38 all_reduce <- tensor_parallel/tp_comm.py:52 forward",
                 "finished": False}
    assert describe(3, w).startswith("rank 3 waits in all_reduce (comm.py:38")
    assert waits_from_stacks("nothing here") is None
    done = waits_from_stacks(DUMP.split("  File \"/x/site-packages/torch/distributed/distributed")[0] +
                             '  File "/x/site-packages/torch/distributed/distributed_c10d.py", line 4100 in barrier\n'
                             '  File "/x/labkit/launch_rank.py", line 263 in rank_main\n')
    assert done == {"op": "barrier", "site": "launch_rank.py rank_main", "finished": True}   # no line

"""The straggler detector (labkit.debug) names each planted slow rank or link, and its cause.

Issue 37, item 3: per-rank entry and exit times of every collective, kept by labkit.comm in a ring
buffer (``Group.log``); ten planted stragglers (``labkit.debug.STRAGGLERS``) across DP, TP, PP and
EP, each named right (rank and cause) from the record of one run; the equalisation trap shown (the
ranks' step times equal, their entries into the collectives not). Tier 1 checks the ring buffer
and the detector on made-up records; tier 2 runs gloo ranks (about 5-15 s per scenario on the
2-core machine): three scenarios here, all ten in the breadth step of .ci/run (``LABKIT_BREADTH=1 -m slow``). The overhead of the log is a
benchmark (tests/bench_call_log.py), not an assertion.
"""
from __future__ import annotations

import os

import pytest

from labkit.debug import STRAGGLERS, detect, run_straggler
from labkit.debug.slowdowns import DELAY, LINK_DELAY
from labkit.debug.stragglers import arrival_skew, collectives, messages
from labkit.groups import CallLog

FAST = ("dp_slow_compute", "tp_slow_link", "ep_router_skew")     # one per cause family, in the suite


# -- tier 1: no processes ------------------------------------------------------------------------
def test_call_log_keeps_the_last_calls_in_order():
    log = CallLog(size=4)
    for i in range(6):
        log.add(f"op{i}", float(i), nbytes=i)
    got = log.entries()
    assert [e[0] for e in got] == [2, 3, 4, 5]                  # seq of the last four, oldest first
    assert [e[1] for e in got] == ["op2", "op3", "op4", "op5"]
    assert all(e[3] >= e[2] for e in got)                        # exit after entry
    log.clear()
    assert log.entries() == [] and log.seq == 0


def _made_up(slow: int, cause: str, steps: int = 4, d: float = 0.4, n: int = 2) -> list[dict]:
    """A DP run of ``n`` ranks, one all-reduce per step, written by hand: rank ``slow`` is late by
    ``d`` (computing, or loading data) and every rank leaves the all-reduce together."""
    recs = [{"rank": r, "coords": {}, "steps": [], "calls": []} for r in range(n)]
    t = 0.0
    for it in range(steps):
        leave = t + 0.1 + d + 0.01
        for r in range(n):
            data = d if (r == slow and cause == "data") else 0.0
            arrive = t + data + 0.1 + (d if (r == slow and cause == "compute") else 0.0)
            recs[r]["steps"].append((it, t, t + data, leave + 0.05))
            recs[r]["calls"].append(("dp", tuple(range(n)), it, "all_reduce", arrive, leave, 64, None))
        t = leave + 0.05
    return recs


@pytest.mark.parametrize("slow,cause", [(0, "compute"), (1, "compute"), (2, "data")])
def test_detector_on_a_made_up_record(slow, cause):
    f = detect(_made_up(slow, cause, n=3))
    assert (f.rank, f.cause) == (slow, cause), str(f)
    assert abs(f.seconds - 0.4) < 1e-9
    assert min(f.waits, key=f.waits.get) == slow                  # it waits least
    assert max(f.late, key=f.late.get) == slow                    # it enters the collective last


def test_no_straggler_in_a_made_up_even_run():
    f = detect(_made_up(0, "compute", d=0.0))
    assert (f.rank, f.cause) == (None, None), str(f)


def test_messages_are_matched_by_link_and_order():
    recs = [{"rank": 0, "calls": [("pp", (0, 1), 0, "p2p", 1.0, 1.1, 8, ((1, 1), ())),
                                  ("pp", (0, 1), 1, "p2p", 2.0, 2.1, 8, ((1,), ()))]},
            {"rank": 1, "calls": [("pp", (0, 1), 0, "p2p", 0.5, 1.2, 0, ((), (0, 0))),
                                  ("pp", (0, 1), 1, "p2p", 1.9, 2.9, 0, ((), (0,)))]}]
    got = messages(recs)
    assert [(m[1], m[2], m[3], m[4], m[5]) for m in got] == [(0, 1, 1.0, 0.5, 1.2), (0, 1, 1.0, 0.5, 1.2),
                                                             (0, 1, 2.0, 1.9, 2.9)]
    assert collectives(recs) == []


# -- tier 2: gloo ranks ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def records():
    return {}


def _record(cache, name):
    if name not in cache:
        cache[name] = run_straggler(name)
    return cache[name]


def _check_named(name, cache):
    want = STRAGGLERS[name].expect
    f = detect(_record(cache, name))
    assert (f.rank, f.cause) == (want["rank"], want["cause"]), f"{name}: {f}; candidates {f.candidates[:6]}; late {f.late}; waits {f.waits}"
    if want["cause"] == "link":                               # LINK_DELAY on each of many calls
        assert f.seconds > 5 * LINK_DELAY, f"{name}: {f}"
    else:                                                     # DELAY once per step
        assert 0.5 * DELAY < f.seconds < 2 * DELAY, f"{name}: {f}"


@pytest.mark.parametrize("name", FAST)
def test_each_straggler_is_named(name, records):
    _check_named(name, records)


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("LABKIT_BREADTH"),
                    reason="the other seven scenarios: the breadth step of .ci/run runs them (LABKIT_BREADTH=1)")
@pytest.mark.parametrize("name", [n for n in STRAGGLERS if n not in FAST])
def test_each_straggler_is_named_all(name, records):
    _check_named(name, records)


def test_the_equalisation_trap(records):
    """DP2, rank 1 computes 1 s longer per step: the two ranks' step times differ by far less than
    their entries into the gradient all-reduce; rank 1 enters last and waits least."""
    rec = _record(records, "dp_slow_compute")
    skew = arrival_skew(rec)
    assert skew["entry_spread"] > 0.5 * DELAY, skew
    assert skew["step_spread"] < skew["entry_spread"] / 4, skew
    f = detect(rec)
    assert max(f.late, key=f.late.get) == 1 and min(f.waits, key=f.waits.get) == 1, (f.late, f.waits)


def test_a_clean_run_has_no_straggler():
    f = detect(run_straggler(None, world_size=2))
    assert (f.rank, f.cause) == (None, None), f"{f}; candidates {f.candidates[:4]}"

"""Check for the lab "When training goes wrong", exercise "name the straggler" (id ``straggler``).

``name_straggler(record) -> {"rank": r, "cause": "compute" | "data"}`` reads the record of one run
(``labkit.debug.run_straggler``: per rank, its ``steps`` [(iteration, begin, data ready, end)] and
its ``calls`` [(group, ranks, seq, op, t_enter, t_exit, nbytes, peers)], seconds on one clock) and
names the slow rank and why. ``produce`` runs a planted straggler (``labkit.debug.STRAGGLERS``)
on gloo, hands the student's function its record, and returns the answer as plain data; ``judge``
compares it with what the scenario planted (``Straggler.expect``, which
tests/test_debug_stragglers.py proves the record shows), never with labkit's detector, which is
banned while the student's code runs. Visible: one scenario; hidden (``solutions/hidden/``): others,
on other ranks, with the other cause and 4 ranks.
"""
from __future__ import annotations

from . import report
from .compare import same
from .hints import asker
from .spec import Spec, call, failed, run

LAB_SCENARIOS = ("dp_slow_compute", "dp_data_stall", "dp4_slow_compute", "tp_dp_slow_compute", "tp_dp_data_stall")
OWN = ("labkit.debug.stragglers:detect", "labkit.debug.stragglers:step_table",
       "labkit.debug.stragglers:_per_rank_excess")
CAUSES = ("compute", "data")


def straggler_record(scenario: str = "dp_data_stall") -> list[dict]:
    """The record of one run of ``scenario`` (what the check hands your function)."""
    from labkit.debug.slowdowns import run_straggler
    if scenario not in LAB_SCENARIOS:
        raise ValueError(f"scenario must be one of {LAB_SCENARIOS}, got {scenario!r}")
    return run_straggler(scenario)


def _produce(student, scenario="dp_data_stall"):
    fn = student.load()["name"]
    record = straggler_record(scenario)
    with student.banning(OWN, "read the record yourself: labkit's detector is what you are writing"):
        got, failure = call(fn, record)
    if failure:
        return failure
    if not isinstance(got, dict):
        return {"failed": "invalid", "detail": f"name_straggler returned a {type(got).__name__}, not a dict "
                                               'with "rank" and "cause"'}
    rank, cause = got.get("rank"), got.get("cause")
    return {"rank": rank if type(rank) is int else (None if rank is None else str(rank)[:40]),
            "cause": None if cause is None else str(cause)[:40], "world_size": len(record)}


def _judge(data, scenario="dp_data_stall"):
    from labkit.debug.slowdowns import STRAGGLERS
    name = "straggler"
    bad = failed(name, data, 'return {"rank": an int, "cause": "compute" or "data"}')
    if bad is not None:
        return bad
    if type(data) is not dict or not {"rank", "cause"} <= data.keys():
        return report(name, False, "not an answer this check takes", 'return {"rank": an int, "cause": "compute" or "data"}')
    want = STRAGGLERS[scenario].expect
    where = f"a run on {STRAGGLERS[scenario].world_size} ranks"
    if not same(data["rank"], want["rank"]):
        return report(name, False, f"{where}: rank {data['rank']!r} is not the slow one",
                      "every rank's step takes as long: compare what each rank spends computing (the step "
                      "minus its data wait minus its time inside calls), or who enters the collectives last")
    if data["cause"] != want["cause"]:
        return report(name, False, f"{where}: rank {want['rank']} is right, the cause {data['cause']!r} not",
                      "data: the time from a step's begin to its data being ready; compute: the rest of the "
                      "step outside calls. Which one is longer than on the other ranks?")
    return report(name, True, f"{where}: rank {want['rank']}, {want['cause']} ({STRAGGLERS[scenario].doc})")


STRAGGLER = Spec("straggler", {"name": "name_straggler"}, _produce, _judge, cases=({"scenario": "dp_data_stall"},),
                 forbid=OWN, why="read the record yourself: labkit's detector is what you are writing", hints=(
                     "a step's time splits into data (begin -> data ready), time inside calls (t_exit - t_enter "
                     "of the calls that entered during the step) and compute (the rest)",
                     "every rank's step takes the same time: the slow rank is the one that computes (or waits "
                     "for data) longer than the others, and so waits least inside the calls",
                     "leave out the first iteration, take each rank's median over the others, and compare each "
                     "rank's data and compute with the smallest rank's"))


def name_the_straggler(fn, scenario: str = "dp_data_stall"):
    """Does ``fn`` name the slow rank and its cause from the record of ``scenario``? One [check] line."""
    return run(STRAGGLER, {"name": fn}, scenario=scenario)


SPECS = {STRAGGLER.id: STRAGGLER}
hint = asker(SPECS)

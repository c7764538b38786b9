"""The pipeline stepper's data: every (schedule, p, m, v) it offers, run through labkit's simulator.

Computed when the book is built (book/_ext/labkit_explorers.py writes it to
``_static/explorers/pipeline.json``; a page carries its own case inline) from
``labkit.pipeline_parallel.schedules`` and ``simulate``: the page draws these timelines, it does
not compute them. tests/test_book_explorers.py decodes every kind of case back to the simulator's
timeline; tests/test_browser_book.py checks the drawn boxes against it.
"""
from __future__ import annotations

SCHEDULES = ("gpipe", "1f1b", "interleaved", "zb-h1")
P_RANGE, M_RANGE, V_RANGE = range(2, 9), range(1, 17), range(1, 5)


def _schedule(name: str, p: int, m: int, v: int):
    from labkit.pipeline_parallel import schedules as s
    if name == "gpipe":
        return s.gpipe(p, m)
    if name == "1f1b":
        return s.one_f_one_b(p, m)
    if name == "zb-h1":
        return s.zb_h1(p, m)
    return s.interleaved(p, v, m)


def case_key(name: str, p: int, m: int, v: int) -> str:
    """Key of one grid point: v is 1 except for the interleaved schedule."""
    return f"{name}/{p}/{m}/{v if name == 'interleaved' else 1}"


def encode_case(name: str, p: int, m: int, v: int) -> dict:
    """One schedule as the page needs it: per rank, its actions in order with idle gaps.

    A rank's text is tokens separated by spaces: ``F3`` (forward of microbatch 3, chunk 0),
    ``B3.1`` (backward of microbatch 3 on chunk 1), ``W3``, or ``+2`` (idle for 2 time units). Each
    action lasts its kind's cost (``costs``: the simulator's defaults, backward = 2 x forward, split
    into B = W = 1 when the schedule has W steps), so the page rebuilds every start and end time.
    """
    from labkit.pipeline_parallel.simulate import simulate
    try:
        sched = _schedule(name, p, m, v)
    except ValueError as err:
        return {"error": str(err)}
    sim = simulate(sched)
    uses_w = any(a.kind == "W" for acts in sched for a in acts)
    costs = {"F": 1.0, "B": 1.0 if uses_w else 2.0, "W": 1.0 if uses_w else 0.0}
    ranks = []
    for r in range(p):
        tokens, t = [], 0.0
        for e in sorted((e for e in sim.timeline if e.rank == r), key=lambda e: e.start):
            if e.start > t:
                tokens.append(f"+{_num(e.start - t)}")
            a = e.action
            tokens.append(f"{a.kind}{a.microbatch}" + (f".{a.chunk}" if a.chunk else ""))
            if e.end - e.start != costs[a.kind]:
                raise AssertionError(f"{name} p={p} m={m}: {a} lasts {e.end - e.start}, not {costs[a.kind]}")
            t = e.end
        ranks.append(" ".join(tokens))
    return {"ranks": ranks, "costs": costs, "makespan": sim.makespan, "bubble": sim.bubble_fraction,
            "peak_in_flight": sim.peak_in_flight, "v": v if name == "interleaved" else 1}


def _num(x: float):
    return int(x) if float(x).is_integer() else x


def pipeline_grid() -> dict:
    """Every (schedule, p, m, v) the stepper offers, encoded (see :func:`encode_case`)."""
    from labkit.pipeline_parallel.plot import SHADES
    cases = {}
    for name in SCHEDULES:
        for p in P_RANGE:
            for m in M_RANGE:
                for v in (V_RANGE if name == "interleaved" else (1,)):
                    if name == "interleaved" and v == 1:
                        continue  # v = 1 is 1F1B (schedules.interleaved says so); the page maps it
                    cases[case_key(name, p, m, v)] = encode_case(name, p, m, v)
    return {"shades": SHADES, "cases": cases,
            "ranges": {"p": [P_RANGE[0], P_RANGE[-1]], "m": [M_RANGE[0], M_RANGE[-1]],
                       "v": [V_RANGE[0], V_RANGE[-1]]}}

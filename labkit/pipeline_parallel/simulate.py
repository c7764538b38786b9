"""Check and time a pipeline schedule (chapters "Pipeline parallelism" and "Interleaved pipeline").

Pure Python. A schedule is ``list[list[Action]]`` (one list per pipeline rank, see
``labkit.pipeline_parallel.schedules``); which action waits for which is
``schedules.dependencies``.

Sends are asynchronous (the executor posts them and moves on); receives block. So a schedule
deadlocks exactly when, at some point, every rank's next action waits for one that never runs:
:func:`simulate` finds that by running the dependency graph, and :func:`validate` reports it.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from .schedules import Action, dependencies


@dataclass(frozen=True)
class Event:
    """One action as it ran (or would run): on ``rank``, from ``start`` to ``end`` (any time unit)."""

    rank: int
    action: Action
    start: float
    end: float


@dataclass
class Simulation:
    """What :func:`simulate` returns.

    ``bubble_fraction`` = idle time / compute time summed over ranks, the quantity
    Narayanan et al. write as (p - 1) / m; ``peak_in_flight[r]`` = most microbatch-chunks whose
    activations rank r holds at once (F done, backward not yet finished).
    """

    timeline: list[Event]
    makespan: float
    busy: list[float]
    bubble_fraction: float
    peak_in_flight: list[int] = field(default_factory=list)


def _shape(schedule) -> tuple[int, int, int]:
    """(p, v, m) of a schedule, from the chunks and microbatches it mentions."""
    if not schedule or not all(isinstance(acts, (list, tuple)) for acts in schedule):
        raise ValueError("a schedule is a non-empty list with one list of actions per rank")
    acts = [a for rank_acts in schedule for a in rank_acts]
    if not all(isinstance(a, Action) for a in acts):
        bad = next(a for a in acts if not isinstance(a, Action))
        raise ValueError(f"schedule entries must be labkit.pipeline_parallel.schedules.Action, got {bad!r}")
    if not acts:
        raise ValueError("the schedule has no actions")
    return len(schedule), 1 + max(a.chunk for a in acts), 1 + max(a.microbatch for a in acts)


def validate(schedule, placement: str = "loop") -> tuple[int, int, int]:
    """Raise ValueError if ``schedule`` cannot run; return its (p, v, m).

    Checks: every rank runs F and B exactly once for each (microbatch, chunk), and W exactly once
    too if the schedule uses W at all; each microbatch's F comes before its B (and B before W) on
    its rank; every activation or gradient sent is received exactly once (that follows from the
    F/B counts, since each send has one fixed receiver); and nothing deadlocks.
    """
    p, v, m = _shape(schedule)
    uses_w = any(a.kind == "W" for acts in schedule for a in acts)
    kinds = ("F", "B", "W") if uses_w else ("F", "B")
    for r, acts in enumerate(schedule):
        counts = Counter(acts)
        want = {Action(k, mb, c) for k in kinds for mb in range(m) for c in range(v)}
        extra = [str(a) for a in acts if a not in want]
        dupes = sorted(str(a) for a, n in counts.items() if n > 1)
        missing = sorted(str(a) for a in want - set(counts))
        if extra or dupes or missing:
            raise ValueError(f"rank {r}: each of {'/'.join(kinds)} must run once per microbatch "
                             f"(m={m}) and chunk (v={v}); missing {missing[:6]}, repeated "
                             f"{dupes[:6]}, unexpected {extra[:6]}")
        pos = {a: i for i, a in enumerate(acts)}
        for a in acts:
            if a.kind != "F":
                before = Action("F" if a.kind == "B" else "B", a.microbatch, a.chunk)
                if pos[before] > pos[a]:
                    raise ValueError(f"rank {r}: {a} at position {pos[a]} comes before {before} "
                                     f"at position {pos[before]}; it needs that one's result")
    simulate(schedule, placement=placement)  # raises on deadlock
    return p, v, m


def simulate(schedule, forward: float = 1.0, backward: float = 2.0, weight: float | None = None,
             comm: float = 0.0, placement: str = "loop") -> Simulation:
    """Time ``schedule`` with fixed costs per action (Narayanan et al. take backward = 2 x forward).

    ``backward`` is the cost of a full backward; when the schedule has W steps it is split into
    B = backward - weight and W = weight (default half each). ``comm`` is added to every
    dependency that crosses ranks. Each rank runs its actions in order, each as soon as the
    rank is free and its inputs have arrived. Raises ValueError on deadlock.
    """
    p, v, m = _shape(schedule)
    uses_w = any(a.kind == "W" for acts in schedule for a in acts)
    w_cost = (backward / 2 if weight is None else weight) if uses_w else 0.0
    cost = {"F": forward, "B": backward - w_cost, "W": w_cost}
    done: dict[tuple[int, Action], float] = {}           # (rank, action) -> end time
    nxt, free = [0] * p, [0.0] * p
    timeline: list[Event] = []
    while True:
        progressed = False
        for r in range(p):
            while nxt[r] < len(schedule[r]):
                a = schedule[r][nxt[r]]
                deps = dependencies(r, a, p, v, placement)
                if not all(d in done for d in deps):
                    break
                start = max([free[r]] + [done[d] + (comm if d[0] != r else 0.0) for d in deps])
                free[r] = done[(r, a)] = start + cost[a.kind]
                timeline.append(Event(r, a, start, free[r]))
                nxt[r] += 1
                progressed = True
        if all(nxt[r] == len(schedule[r]) for r in range(p)):
            break
        if not progressed:
            stuck = {r: str(schedule[r][nxt[r]]) for r in range(p) if nxt[r] < len(schedule[r])}
            raise ValueError(f"deadlock: every unfinished rank waits on an action that cannot run "
                             f"first (rank: next action) {stuck}")
    busy = [sum(e.end - e.start for e in timeline if e.rank == r) for r in range(p)]
    makespan = max(e.end for e in timeline)
    return Simulation(timeline=sorted(timeline, key=lambda e: (e.start, e.rank)), makespan=makespan,
                      busy=busy, bubble_fraction=(p * makespan - sum(busy)) / sum(busy),
                      peak_in_flight=[peak_in_flight(acts) for acts in schedule])


def peak_in_flight(actions) -> int:
    """Most microbatch-chunks whose activations one rank holds at once, over its action list.

    An activation is held from its F until its backward is complete: B, or W when the schedule
    splits the backward (W still needs the saved layer inputs).
    """
    last = "W" if any(a.kind == "W" for a in actions) else "B"
    held = peak = 0
    for a in actions:
        held += (a.kind == "F") - (a.kind == last)
        peak = max(peak, held)
    return peak

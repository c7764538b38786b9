"""The pipelining schedules' own action lists, timed and drawn beside labkit's (chapter "From
labkit to PyTorch-native", the ZB-V and DualPipeV figure).

``torch.distributed.pipelining`` builds each schedule as data too: ``schedule.pipeline_order[rank]``
is a list of ``_Action(stage_index, F | I | W | B, microbatch)`` (I: the input-gradient half of the
backward, W: the weight-gradient half, B: both; DualPipeV also has ``OVERLAP_F_B``, a forward and a
backward of two microbatches issued together). :func:`torch_order` asks PyTorch for those lists
without processes (its ``_schedule_visualizer.get_schedule_ops``); :func:`simulate_order` runs them
with fixed costs on the dependency graph of stage indices, the way
``labkit.pipeline_parallel.simulate`` runs labkit's, and returns labkit ``Event`` objects, so
``labkit.pipeline_parallel.plot.render`` draws both the same way.

Costs: one stage of the whole model forward = 1, backward = 2 (input half 1, weight half 1), so
with v stages per rank each action costs 1/v of that: every rank holds the same layers whatever v.
"""
from __future__ import annotations

from ..pipeline_parallel.schedules import Action
from ..pipeline_parallel.simulate import Event, Simulation
from .pipeline import stage_indices

_KIND = {"F": "F", "I": "B", "B": "B", "W": "W"}   # torch's action -> labkit's box kind
_COST = {"F": 1.0, "I": 1.0, "B": 2.0, "W": 1.0}


def torch_order(schedule: str, pp: int, m: int) -> list[list[tuple[str, int, int]]]:
    """Per rank, the compute actions of torch's ``schedule`` as (kind, stage, microbatch), in
    order; an ``OVERLAP_F_B`` becomes its forward then its backward."""
    from torch.distributed.pipelining._schedule_visualizer import get_schedule_ops
    if schedule == "1F1B":   # a single-stage schedule keeps no order of the other ranks
        raise ValueError("Schedule1F1B builds only its own rank's order while it runs; labkit's "
                         "one_f_one_b is the same schedule (warm-up p - r - 1 forwards)")
    ops = get_schedule_ops(schedule, pp, m, 2)
    out = []
    for rank_ops in ops:
        acts = []
        for a in rank_ops:
            if a is None:
                continue
            for sub in (a.sub_actions or (a,)):
                kind = sub.computation_type.value
                if kind in _COST:
                    acts.append((kind, sub.stage_index, sub.microbatch_index))
        out.append(acts)
    return out


def simulate_order(order, schedule: str, pp: int) -> Simulation:
    """Time ``order`` (from :func:`torch_order`): each rank runs its actions in order, each as soon
    as the rank is free and its inputs exist. F(s) needs F(s-1); the backward of s (I or B) needs
    F(s) and the backward of s+1; W(s) needs I(s). Raises ValueError on a deadlock."""
    v = 2                                            # the multi-stage schedules, 2 stages per rank
    S = pp * v
    chunk = {s: c for r in range(pp) for c, s in enumerate(stage_indices(schedule, pp, r, v))}
    done: dict = {}                                  # (kind, stage, mb) -> end time ("I" for B too)
    nxt, free, timeline = [0] * pp, [0.0] * pp, []

    def deps(kind, s, mb):
        if kind == "F":
            return [("F", s - 1, mb)] if s > 0 else []
        if kind in ("I", "B"):
            return [("F", s, mb)] + ([("I", s + 1, mb)] if s < S - 1 else [])
        return [("I", s, mb)]

    while any(nxt[r] < len(order[r]) for r in range(pp)):
        progressed = False
        for r in range(pp):
            while nxt[r] < len(order[r]):
                kind, s, mb = order[r][nxt[r]]
                if not all(d in done for d in deps(kind, s, mb)):
                    break
                start = max([free[r]] + [done[d] for d in deps(kind, s, mb)])
                free[r] = start + _COST[kind] / v
                done[("I" if kind == "B" else kind, s, mb)] = free[r]
                if kind == "B":
                    done[("W", s, mb)] = free[r]
                timeline.append(Event(r, Action(_KIND[kind], mb, chunk[s]), start, free[r]))
                nxt[r] += 1
                progressed = True
        if not progressed:
            raise ValueError(f"deadlock in {schedule}: ranks wait on {[order[r][nxt[r]] for r in range(pp) if nxt[r] < len(order[r])]}")
    busy = [sum(e.end - e.start for e in timeline if e.rank == r) for r in range(pp)]
    makespan = max(e.end for e in timeline)
    return Simulation(timeline=sorted(timeline, key=lambda e: (e.start, e.rank)), makespan=makespan,
                      busy=busy, bubble_fraction=(pp * makespan - sum(busy)) / sum(busy))


def schedule_timeline(schedule: str, pp: int, m: int) -> Simulation:
    """torch's ``schedule`` for ``pp`` ranks and ``m`` microbatches, timed (unit costs above)."""
    return simulate_order(torch_order(schedule, pp, m), schedule, pp)


def labkit_zb_h1(pp: int, m: int) -> Simulation:
    """labkit's ZB-H1 with the same costs (F 1, B 1, W 1), for the side-by-side figure."""
    from ..pipeline_parallel.schedules import zb_h1
    from ..pipeline_parallel.simulate import simulate
    return simulate(zb_h1(pp, m), forward=1.0, backward=2.0, weight=1.0)

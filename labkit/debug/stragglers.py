"""The slow rank, named from the record of one run, with its cause.

Chapter "When training goes wrong", section "The slow rank". A data-parallel step ends in an
all-reduce that nobody leaves before the last rank arrives, so every rank's step takes as long as
the slowest one's: per-rank step times are EQUAL, and hide the culprit. What differs is when each
rank ENTERS the collectives: the slow rank arrives last and waits least. labkit's communication
layer keeps when each call entered and returned (``Group.log``, a ring buffer that stays on); the
probe :class:`StepClock` adds when each step began, when its data was ready and when it ended.

    record = labkit.train(..., probe=StepClock).ranks      # [rank]["probe"]: one rank's record
    finding = detect([r["probe"] for r in record])         # Finding(rank=1, cause="compute", ...)

A step of rank r splits into ``data`` (begin -> the microbatches are ready), ``comm`` (inside
labkit's calls: waiting for the others, then moving bytes) and ``compute`` (the rest). The
detector compares, step by step, what each rank spent beyond the fastest one:

    compute   a rank computes longer than the others (they wait for it in the next collective)
    data      a rank's data arrives later (same picture, but the time is before the step)
    router    compute, on the rank whose experts received the most rows (a skewed MoE router)
    link      once the last member arrived, a collective (or a point-to-point message) still took
              long: the bytes moved slowly between those ranks (named as the pair, or group)

Times are ``time.perf_counter()``: one clock for the processes of one machine. Across machines,
shift each rank's clock so that the exits of its collectives agree (all members leave a blocking
collective together); that is left out here.
"""
from __future__ import annotations

import statistics
import time
from collections import defaultdict
from dataclasses import dataclass, field

WARMUP = 1            # iterations left out: the first one pays for first calls and allocations
THRESHOLD = 0.1       # seconds per step: an excess below this is noise, not a straggler
ROUTER_SKEW = 1.5     # the late rank received this many times the others' rows: the router


class StepClock:
    """``labkit.train(probe=StepClock)``: on every rank, when each step began, when its data was
    ready (``engine.step`` entered) and when it ended, plus every group's call log (cleared here,
    so the record is this run's training only). ``end()`` returns the rank's record (plain data)."""

    def __init__(self, engine, topo, groups, cfg):
        import torch.distributed as dist
        self.rank, self.coords, self.groups = dist.get_rank(), topo.coords(dist.get_rank()), groups
        self.steps, self._t_begin, self._it = [], None, None
        for g in groups.values():
            if getattr(g, "log", None) is not None:
                g.log.clear()
        step = engine.step

        def timed_step(*args, **kwargs):                  # the data is ready when the step is called
            t_in = time.perf_counter()
            out = step(*args, **kwargs)
            self.steps.append((self._it, self._t_begin, t_in, time.perf_counter()))
            return out
        engine.step = timed_step

    def begin(self, iteration: int) -> None:
        self._it, self._t_begin = iteration, time.perf_counter()

    def end(self) -> dict:
        calls, seen = [], set()
        for name, g in self.groups.items():
            if getattr(g, "log", None) is None or id(g) in seen or g.size < 2:
                continue
            seen.add(id(g))
            calls += [(name, tuple(g.ranks), *e) for e in g.log.entries()]
        return {"rank": self.rank, "coords": self.coords, "steps": self.steps, "calls": calls}


# -- a record, read ----------------------------------------------------------------------------
@dataclass
class Call:
    """One call on one group, as every member saw it: {rank: time} entering and leaving."""

    group: str
    ranks: tuple
    seq: int
    op: str
    enter: dict = field(default_factory=dict)
    exit: dict = field(default_factory=dict)
    nbytes: dict = field(default_factory=dict)

    @property
    def last(self) -> int:
        """The rank that arrived last."""
        return max(self.enter, key=self.enter.get)

    @property
    def busy(self) -> float:
        """From the last arrival to the first departure: the time the call itself took."""
        return max(0.0, min(self.exit.values()) - max(self.enter.values()))


def collectives(records: list[dict]) -> list[Call]:
    """Every collective of the run, matched across its members by (group, ranks, seq), in order of
    the first entry; point-to-point batches are left out (:func:`messages`)."""
    calls = {}
    for rec in records:
        for name, ranks, seq, op, t_in, t_out, nbytes, _ in rec["calls"]:
            if op == "p2p":
                continue
            c = calls.setdefault((name, ranks, seq), Call(name, ranks, seq, op))
            c.enter[rec["rank"]], c.exit[rec["rank"]], c.nbytes[rec["rank"]] = t_in, t_out, nbytes
    whole = [c for c in calls.values() if len(c.enter) == len(c.ranks)]
    return sorted(whole, key=lambda c: min(c.enter.values()))


def messages(records: list[dict]) -> list[tuple]:
    """Point-to-point messages matched by link and order: (group, src, dst, t_sent, t_recv_enter,
    t_recv_exit): the sender's batch entry, the receiver's batch entry and exit."""
    sent, got = defaultdict(list), defaultdict(list)
    for rec in records:
        me = rec["rank"]
        for name, _, _, op, t_in, t_out, _, peers in sorted(rec["calls"], key=lambda c: c[4]):
            if op != "p2p":
                continue
            for dst in peers[0]:
                sent[(name, me, dst)].append(t_in)
            for src in peers[1]:
                got[(name, src, me)].append((t_in, t_out))
    return [(*link, s, r_in, r_out) for link in sent for s, (r_in, r_out) in zip(sent[link], got.get(link, []))]


def step_table(records: list[dict]) -> dict:
    """{rank: {iteration: {"step", "data", "comm", "compute", "begin", "end"}}} (seconds)."""
    out = {}
    for rec in records:
        rows = {}
        for it, t_begin, t_in, t_out in rec["steps"]:
            comm = sum(c[5] - c[4] for c in rec["calls"] if t_begin <= c[4] <= t_out)
            rows[it] = {"step": t_out - t_begin, "data": t_in - t_begin, "comm": comm,
                        "compute": t_out - t_in - comm, "begin": t_begin, "end": t_out}
        out[rec["rank"]] = rows
    return out


def iteration_of(table: dict, rank: int, t: float):
    for it, row in table[rank].items():
        if row["begin"] <= t <= row["end"]:
            return it
    return None


# -- the detector --------------------------------------------------------------------------------
@dataclass
class Finding:
    """The slow rank (or the slow link: a pair or a group of ranks) and why; None, None: no
    straggler. ``seconds``: what it costs per step; ``candidates`` every suspect, worst first;
    ``late`` {rank: seconds per step it entered collectives after their first member}; ``waits``
    {rank: seconds per step spent in calls}: the straggler arrives last and waits least."""

    rank: object
    cause: str | None
    seconds: float
    candidates: list
    late: dict
    waits: dict

    def __str__(self) -> str:
        if self.cause is None:
            return f"no straggler (largest excess {self.seconds * 1e3:.0f} ms per step)"
        who = f"link {self.rank}" if self.cause == "link" else f"rank {self.rank}"
        return f"{who}: {self.cause}, {self.seconds * 1e3:.0f} ms per step"


def _per_rank_excess(table: dict, key: str, its: list) -> dict:
    """{rank: median over iterations of (its ``key`` time - the smallest rank's)}."""
    out = {}
    for r in table:
        out[r] = statistics.median(table[r][it][key] - min(table[q][it][key] for q in table) for it in its)
    return out


def _link_excess(records, table, calls, its) -> dict:
    """{(group, ranks): seconds per step a group's calls (or a link's messages) took after their last
    arrival beyond its siblings' (the other groups of its axis, or links of its group, which make the
    same calls in the same order): the median over calls of (its time - the least of all siblings'
    at that call), times its calls per step. A median: a loaded machine's hiccups hit single calls,
    a slow link every one. A group (or link) with no sibling is left out: nothing to compare with."""
    took = defaultdict(dict)                      # (name, ranks) -> {k: seconds after the last arrival}
    for c in calls:
        if iteration_of(table, c.ranks[0], min(c.enter.values())) in its:
            took[(c.group, tuple(sorted(c.ranks)))][c.seq] = c.busy
    batches, order = {}, defaultdict(list)         # each receiving batch once, per direction of a link
    for name, src, dst, t_sent, r_in, r_out in messages(records):
        key = ((name + ":p2p", src, dst), r_in)
        if key not in batches and iteration_of(table, dst, r_in) in its:
            order[key[0]].append(key)
        if key in batches or iteration_of(table, dst, r_in) in its:
            batches[key] = max(batches.get(key, 0.0), r_out - max(t_sent, r_in))
    for (name, src, dst), keys in order.items():   # a link: the slower of its two directions, call by call
        pair = took[(name, tuple(sorted((src, dst))))]
        for k, key in enumerate(keys):
            pair[k] = max(pair.get(k, 0.0), batches[key])
    siblings = defaultdict(list)
    for key in took:
        siblings[key[0]].append(key)
    out = {}
    for name, keys in siblings.items():
        if len(keys) < 2:
            continue
        common = set.intersection(*(set(took[k]) for k in keys))
        floor = {k: min(took[key][k] for key in keys) for k in common}
        for key in keys:
            if common:
                out[key] = statistics.median(took[key][k] - floor[k] for k in common) * len(common) / len(its)
    return out


def _rows_received(calls, rank: int) -> float:
    """Rows this rank's experts received over the other ranks' mean (1.0: balanced), from the
    bytes of the expert all-to-alls whose sizes differ across ranks (the dispatches; a combine
    returns each rank its own tokens)."""
    ratios = []
    for c in calls:
        if c.op == "all_to_all" and rank in c.nbytes and len(set(c.nbytes.values())) > 1:
            others = [b for r, b in c.nbytes.items() if r != rank]
            mean = sum(others) / len(others)
            ratios.append(c.nbytes[rank] / mean if mean > 0 else float("inf"))
    return statistics.mean(ratios) if ratios else 1.0


def detect(records: list[dict], warmup: int = WARMUP, threshold: float = THRESHOLD) -> Finding:
    """Name the slow rank (or link) and its cause from one run's per-rank records (see the module
    docstring): the largest time per step one rank (or link) spends beyond the others."""
    table = step_table(records)
    its = sorted(set.intersection(*(set(t) for t in table.values())))
    its = its[warmup:] if len(its) > warmup else its
    calls = collectives(records)
    cands = [(s, r, "compute") for r, s in _per_rank_excess(table, "compute", its).items()]
    cands += [(s, r, "data") for r, s in _per_rank_excess(table, "data", its).items()]
    cands += [(s, ranks, "link") for (_, ranks), s in _link_excess(records, table, calls, its).items()]
    cands.sort(key=lambda c: -c[0])
    seconds, rank, cause = cands[0]
    if cause == "compute" and _rows_received(calls, rank) > ROUTER_SKEW:
        cause = "router"
    late = defaultdict(lambda: defaultdict(float))
    for c in calls:
        it = iteration_of(table, c.ranks[0], min(c.enter.values()))
        for r, t in c.enter.items():
            late[r][it] += t - min(c.enter.values())
    late = {r: statistics.median(late[r].get(it, 0.0) for it in its) for r in table}
    waits = {r: statistics.median(table[r][it]["comm"] for it in its) for r in table}
    if seconds < threshold:
        rank, cause = None, None
    return Finding(rank, cause, seconds, cands, late, waits)


def arrival_skew(records: list[dict], warmup: int = WARMUP) -> dict:
    """The equalisation trap in two numbers (medians over iterations, seconds): ``step_spread``,
    how much the ranks' step times differ, and ``entry_spread``, how much their entries into each
    iteration's most skewed collective differ."""
    table = step_table(records)
    its = sorted(set.intersection(*(set(t) for t in table.values())))[warmup:]
    step = statistics.median(max(table[r][it]["step"] for r in table) - min(table[r][it]["step"] for r in table)
                             for it in its)
    worst = defaultdict(float)
    for c in collectives(records):
        it = iteration_of(table, c.ranks[0], min(c.enter.values()))
        worst[it] = max(worst[it], max(c.enter.values()) - min(c.enter.values()))
    return {"step_spread": step, "entry_spread": statistics.median(worst[it] for it in its)}

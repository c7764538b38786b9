"""Pipeline schedules as data (chapters "Pipeline parallelism" and "Interleaved pipeline").

A schedule is one list of actions per pipeline rank, in the order that rank runs them. The same
lists are checked and timed by ``labkit.pipeline_parallel.simulate``, drawn by
``labkit.pipeline_parallel.plot.render``, turned into NCCL-safe point-to-point steps by
``labkit.pipeline_parallel.p2p_plan`` and run for real by ``labkit.pipeline_parallel.executor``.
Pure Python: no torch, no processes.

    >>> [str(a) for a in one_f_one_b(p=2, m=3)[0]]
    ['F0', 'F1', 'B0', 'F2', 'B1', 'B2']

An action is ``Action(kind, microbatch, chunk)``: kind ``"F"`` (forward), ``"B"`` (backward; the
input-gradient half when the schedule also has ``"W"`` steps) or ``"W"`` (weight gradient). With
``v`` model chunks per rank, which virtual stage chunk c of rank r is belongs to
``placement.py`` (Megatron-LM's "loop" by default: rank r holds stages r, r+p, ..., r+(v-1)p). Communication is implied, not
listed: the F of stage s sends its output to the F of stage s+1 (same microbatch); the B of stage
s sends the gradient of its input to the B of stage s-1.

Builders (p = pipeline ranks, m = microbatches per iteration, v = chunks per rank):

* :func:`gpipe`        all forwards, then all backwards (Huang et al., 2019). m activations held.
* :func:`one_f_one_b`  PipeDream-Flush / Megatron's non-interleaved schedule (Narayanan et al.,
                       2021, Sec. 2.2.1): warm-up of ``min(p-r-1, m)`` forwards, steady one
                       forward one backward, cool-down of backwards. At most p activations held.
* :func:`interleaved`  Megatron's interleaved 1F1B (Narayanan et al., 2021, Sec. 2.2.2): warm-up
                       ``min(2(p-r-1) + (v-1)p, m v)``; m must be a multiple of p.
* :func:`zb_h1`        Zero-bubble ZB-H1 (Qi et al., 2024): backward split into B (input grad)
                       and W (weight grad); W steps are deferred into the cool-down bubble.
* :func:`gpipe_v`      GPipe's order on the V placement (v = 2: rank r holds stages r and 2p-1-r,
                       Qi et al., 2024b): the turn of the V is a local hand-off on rank p - 1, and
                       rank 0 holds both ends (a tied embedding needs no embedding group).

:func:`build` makes a named schedule of ``placement.SCHEDULES`` (``TrainConfig.pipeline_schedule``).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..validate import int_at_least, positive_int
from .placement import SCHEDULES, check_schedule, holder, stage_of

__all__ = ["Action", "gpipe", "one_f_one_b", "interleaved", "zb_h1", "gpipe_v", "build", "warmup_1f1b",
           "warmup_interleaved", "stage_of", "bubble_formula", "dependencies"]

KINDS = ("F", "B", "W")


@dataclass(frozen=True, order=True)
class Action:
    """One step on one rank: ``kind`` in F/B/W of ``microbatch`` on model ``chunk`` of this rank."""

    kind: str
    microbatch: int
    chunk: int = 0

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"action kind must be one of {KINDS}, got {self.kind!r}")
        for name in ("microbatch", "chunk"):
            int_at_least(f"action {name}", getattr(self, name), 0)

    def __str__(self) -> str:  # "F3", or "F3.1" for chunk 1
        return f"{self.kind}{self.microbatch}" + (f".{self.chunk}" if self.chunk else "")


def F(mb: int, chunk: int = 0) -> Action:
    return Action("F", mb, chunk)


def B(mb: int, chunk: int = 0) -> Action:
    return Action("B", mb, chunk)


def W(mb: int, chunk: int = 0) -> Action:
    return Action("W", mb, chunk)


def _check_sizes(p: int, m: int, v: int = 1) -> None:
    for name, value in (("pipeline ranks p", p), ("microbatches m", m), ("chunks v", v)):
        positive_int(name, value)


# ---------------------------------------------------------------------------------------------
def gpipe(p: int, m: int) -> list[list[Action]]:
    """GPipe: every rank runs F0..F(m-1), then B0..B(m-1); all m activations live at once."""
    _check_sizes(p, m)
    return [[F(i) for i in range(m)] + [B(i) for i in range(m)] for _ in range(p)]


def gpipe_v(p: int, m: int) -> list[list[Action]]:
    """GPipe (Huang et al. 2019, arXiv:1811.06965) on the V placement (Qi et al. 2024, "Pipeline
    Parallelism with Controllable Memory", arXiv:2405.15362): rank r holds chunk 0 = stage r and
    chunk 1 = stage 2p-1-r. Every rank runs all forwards of chunk 0, then of chunk 1, then all
    backwards of chunk 1, then of chunk 0; 2m microbatch-chunks of activations live at once.

        >>> [str(a) for a in gpipe_v(p=2, m=2)[1]]
        ['F0', 'F1', 'F0.1', 'F1.1', 'B0.1', 'B1.1', 'B0', 'B1']
    """
    _check_sizes(p, m)
    return [[F(i, c) for c in (0, 1) for i in range(m)] + [B(i, c) for c in (1, 0) for i in range(m)]
            for _ in range(p)]


def build(name: str, p: int, v: int, m: int) -> list[list[Action]]:
    """The schedule ``name`` of ``placement.SCHEDULES`` for p ranks, v chunks each, m microbatches.
    A builder whose chunk count the table leaves open (None) takes v; the others fix it."""
    check_schedule(name, v)
    builder, _, chunks = SCHEDULES[name]
    fn = globals()[builder]
    return fn(p, v, m) if chunks is None else fn(p, m)


def warmup_1f1b(p: int, r: int, m: int) -> int:
    """Forwards rank r runs before its first backward in 1F1B: ``min(p - r - 1, m)``."""
    return min(p - r - 1, m)


def one_f_one_b(p: int, m: int) -> list[list[Action]]:
    """1F1B: warm-up forwards, then alternate one forward / one backward, then drain backwards.

    Rank r never holds more than ``warmup + 1 <= p - r`` microbatches' activations, whatever m
    is; GPipe holds m. Same bubble as GPipe, (p - 1) / m (Narayanan et al., 2021, Sec. 2.2.1).
    """
    _check_sizes(p, m)
    schedule = []
    for r in range(p):
        w = warmup_1f1b(p, r, m)
        acts = [F(i) for i in range(w)]                 # warm-up: fill the pipe
        for i in range(m - w):                          # steady state: 1F1B
            acts += [F(w + i), B(i)]
        acts += [B(i) for i in range(m - w, m)]         # cool-down: drain it (the flush)
        schedule.append(acts)
    return schedule


def warmup_interleaved(p: int, v: int, r: int, m: int) -> int:
    """Megatron's interleaved warm-up on rank r: ``min(2(p-r-1) + (v-1)p, m*v)`` chunk-forwards."""
    return min(2 * (p - r - 1) + (v - 1) * p, m * v)


def _virtual_mb(k: int, p: int, v: int, forward: bool) -> tuple[int, int]:
    """The k-th chunk-microbatch a rank runs -> (microbatch, chunk), Megatron's order.

    Microbatches go through the chunks in groups of p: chunk 0 runs mb 0..p-1, then chunk 1 runs
    the same p microbatches, ...; backward visits the chunks last to first.
    """
    group, within = divmod(k, p * v)
    chunk = within // p
    mb = group * p + within % p
    return mb, (chunk if forward else v - 1 - chunk)


def interleaved(p: int, v: int, m: int) -> list[list[Action]]:
    """Interleaved 1F1B with ``v`` model chunks per rank; bubble (p-1)/(v m) for v times the p2p.

    Raises ValueError unless m is a multiple of p (Megatron's rule for this schedule). With
    v = 1 it is plain :func:`one_f_one_b`, as in Megatron (which then uses the non-interleaved
    schedule; the interleaved warm-up formula would hold p - r - 1 extra microbatches).
    """
    _check_sizes(p, m, v)
    if v == 1:
        return one_f_one_b(p, m)
    if m % p:
        raise ValueError(f"interleaved schedule needs microbatches m a multiple of pipeline size p: "
                         f"m {m} % p {p} = {m % p}")
    total = m * v
    schedule = []
    for r in range(p):
        w = warmup_interleaved(p, v, r, m)
        fwd = [F(*_virtual_mb(k, p, v, True)) for k in range(total)]
        bwd = [B(*_virtual_mb(k, p, v, False)) for k in range(total)]
        acts = fwd[:w]
        for i in range(total - w):
            acts += [fwd[w + i], bwd[i]]
        acts += bwd[total - w:]
        schedule.append(acts)
    return schedule


def zb_h1(p: int, m: int) -> list[list[Action]]:
    """ZB-H1 (Qi et al., 2024, "Zero Bubble Pipeline Parallelism", Sec. 3.1).

    Backward is split into B (gradient w.r.t. the stage input, which the previous stage waits
    for) and W (gradient w.r.t. the weights, which nobody waits for). Rank r keeps 1F1B's order
    of F and B; whenever it would sit idle waiting for an input it runs a pending W instead, and
    it lets at most r W steps pile up (so it holds at most p microbatches, like 1F1B's rank 0).
    The list is built by running that rule once with unit costs F = B = W; the bubble then drops
    from 1F1B's (p - 1) / m to (p - 1) / (3 m) for m >= p (``simulate(..., weight=1)``).
    """
    _check_sizes(p, m)
    order = one_f_one_b(p, m)
    out: list[list[Action]] = [[] for _ in range(p)]
    done: dict = {}                                     # (rank, action) -> end time
    t, nxt, pending = [0] * p, [0] * p, [[] for _ in range(p)]

    def unfinished(r):
        return nxt[r] < len(order[r]) or pending[r]

    while any(unfinished(r) for r in range(p)):
        r = min((r for r in range(p) if unfinished(r)), key=lambda r: (t[r], r))  # earliest rank
        a = order[r][nxt[r]] if nxt[r] < len(order[r]) else None
        ready = a is not None and all(done.get(d, t[r] + 1) <= t[r] for d in dependencies(r, a, p, 1))
        if ready and len(pending[r]) <= r:              # next F/B can run now: run it
            nxt[r] += 1
            if a.kind == "B":
                pending[r].append(W(a.microbatch))
        elif pending[r]:                                # would wait (or too many W held): run a W
            a = pending[r].pop(0)
        else:                                           # nothing to do: idle one time unit
            t[r] += 1
            continue
        out[r].append(a)
        t[r] += 1
        done[(r, a)] = t[r]
    return out


def bubble_formula(p: int, m: int, v: int = 1) -> float:
    """Idle time over compute time for equal-cost stages: ``(p - 1) / (v m)`` (Narayanan, Eq. 1)."""
    _check_sizes(p, m, v)
    return (p - 1) / (v * m)


def dependencies(rank: int, a: Action, p: int, v: int, placement: str = "loop") -> list[tuple[int, Action]]:
    """(rank, action) pairs that must finish before ``a`` on ``rank`` may start (S = p*v stages).

    F(s, mb) needs F(s-1, mb): the activation arrives from the rank holding stage s-1.
    B(s, mb) needs F(s, mb) and, below the last stage, B(s+1, mb): the gradient of its output.
    W(s, mb) needs B(s, mb) (it reuses B's saved tensors).
    """
    s, last = stage_of(rank, a.chunk, p, v, placement), p * v - 1
    if a.kind == "F":
        if s == 0:
            return []
        r, c = holder(s - 1, p, v, placement)
        return [(r, Action("F", a.microbatch, c))]
    if a.kind == "B":
        own = [(rank, Action("F", a.microbatch, a.chunk))]
        if s == last:
            return own
        r, c = holder(s + 1, p, v, placement)
        return own + [(r, Action("B", a.microbatch, c))]
    return [(rank, Action("B", a.microbatch, a.chunk))]

"""The point-to-point messages of a schedule, batched into steps that NCCL can run without deadlock.

Chapters "Pipeline parallelism" and "Interleaved pipeline". Pure Python, no torch.

NCCL ignores tags: between two ranks, the n-th send is received by the n-th receive, in order. And a
large send does not finish until the peer has posted the matching receive. Megatron-LM therefore
never sends and receives separately in its schedules: it batches "send my result, receive my next
input" into one ``batch_isend_irecv`` (``send_forward_recv_backward`` and friends in
``megatron/core/pipeline_parallel/p2p_communication.py``). labkit derives the same batches from any
action list (``labkit.pipeline_parallel.schedules``):

    step before a tick  =  the sends the previous tick produced  +  the receives this tick needs
    final step          =  the sends of the last tick

where a tick is one action (Megatron's non-interleaved 1F1B) or, for the interleaved schedule, a
steady-state pair "forward, backward" (Megatron's interleaved 1F1B).
and proves, before anything runs, that the steps cannot deadlock and that every receive gets the
message it expects, under the strictest rule a transport can impose (rendezvous: an operation
completes only while its peer's matching operation is posted too; a rank leaves a step only when
all the step's operations completed). A buffered transport (gloo, small NCCL messages) can only
complete sooner. The executor runs exactly these steps, so what is checked here is what runs.

A message is identified as ``Message(kind, stage, microbatch)``: kind "F" is the activation entering
virtual stage ``stage``, kind "B" the gradient of stage ``stage``'s output. A hand-off between two
stages on one rank (``placement.hands_off_locally``: the turn of a V) is no message: the executor
passes the tensor between its chunks, and :func:`plan` checks that the rank's order runs the
producer first (:func:`check_local`).
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from .placement import hands_off_locally, holder, stage_of
from .schedules import Action


@dataclass(frozen=True)
class Message:
    kind: str        # "F": activation into ``stage``; "B": gradient of ``stage``'s output
    stage: int
    microbatch: int

    def __str__(self) -> str:
        return f"{'activation into' if self.kind == 'F' else 'gradient of'} stage {self.stage}, mb {self.microbatch}"


@dataclass
class Step:
    """One batched exchange on one rank: ``sends`` [(peer, Message)], ``recvs`` [(peer, Message)]."""

    sends: list = field(default_factory=list)
    recvs: list = field(default_factory=list)
    before: int | None = None   # index of the action it precedes (None: after the last action)

    def __bool__(self) -> bool:
        return bool(self.sends or self.recvs)


def needs(a: Action, rank: int, p: int, num_stages: int, placement: str = "loop"):
    """(peer, Message) that action ``a`` must receive first, or None (none, or handed over locally)."""
    v = num_stages // p
    s = stage_of(rank, a.chunk, p, v, placement)
    if a.kind == "F" and s > 0 and not hands_off_locally(s - 1, p, v, placement):
        return holder(s - 1, p, v, placement)[0], Message("F", s, a.microbatch)
    if a.kind == "B" and s < num_stages - 1 and not hands_off_locally(s, p, v, placement):
        return holder(s + 1, p, v, placement)[0], Message("B", s, a.microbatch)
    return None


def produces(a: Action, rank: int, p: int, num_stages: int, placement: str = "loop"):
    """(peer, Message) that action ``a`` sends when it is done, or None (none, or handed over locally)."""
    v = num_stages // p
    s = stage_of(rank, a.chunk, p, v, placement)
    if a.kind == "F" and s < num_stages - 1 and not hands_off_locally(s, p, v, placement):
        return holder(s + 1, p, v, placement)[0], Message("F", s + 1, a.microbatch)
    if a.kind == "B" and s > 0 and not hands_off_locally(s - 1, p, v, placement):
        return holder(s - 1, p, v, placement)[0], Message("B", s - 1, a.microbatch)
    return None


def check_local(schedule, placement: str = "loop") -> None:
    """ValueError unless every locally handed-off tensor is made before it is used: on a rank
    holding stages s and s + 1, F of s + 1 comes after F of s, and B of s after B of s + 1."""
    p = len(schedule)
    v = 1 + max(a.chunk for acts in schedule for a in acts)
    for r, acts in enumerate(schedule):
        pos = {a: i for i, a in enumerate(acts)}
        for a in acts:
            s = stage_of(r, a.chunk, p, v, placement)
            src = s - 1 if a.kind == "F" else s + 1 if a.kind == "B" else None
            if src is None or not 0 <= src < p * v or not hands_off_locally(min(s, src), p, v, placement):
                continue
            before = Action(a.kind, a.microbatch, holder(src, p, v, placement)[1])
            if pos.get(before, len(acts)) > pos[a]:
                raise ValueError(f"rank {r} runs {a} (stage {s}) before {before} (stage {src}), "
                                 f"whose result it takes over locally")


def per_action_ticks(actions) -> list[list[int]]:
    """Every F or B its own tick (a W, which sends nothing, joins the tick before it): Megatron's
    non-interleaved 1F1B, which batches ``send_forward_recv_backward`` between a forward and the
    next backward (``megatron/core/pipeline_parallel/schedules.py``)."""
    out: list[list[int]] = []
    for i, a in enumerate(actions):
        if a.kind == "W" and out:
            out[-1].append(i)
        else:
            out.append([i])
    return out


def interleaved_ticks(actions) -> list[list[int]]:
    """Megatron's interleaved schedule: warm-up forwards one by one, then steady-state pairs
    "forward, backward" that communicate once per pair (``send_forward_backward_recv_forward_backward``,
    whose receives serve the NEXT pair), then cool-down backwards one by one."""
    kinds = [a.kind for a in actions]
    first_b = kinds.index("B") if "B" in kinds else len(kinds)
    if first_b == kinds.count("F"):                     # every forward before every backward
        return per_action_ticks(actions)
    out = [[i] for i in range(first_b - 1)]
    i = first_b - 1
    while i + 1 < len(kinds) and kinds[i] == "F" and kinds[i + 1] == "B":
        out.append([i, i + 1])
        i += 2
    return out + [[j] for j in range(i, len(kinds))]


def rank_steps(actions, rank: int, p: int, v: int, ticks=per_action_ticks,
               placement: str = "loop") -> list[Step]:
    """The steps of one rank, in order: one batch between two ticks, which sends what the tick
    before produced and receives what the tick after needs."""
    S, steps, pending = p * v, [], []
    for tick in ticks(actions):
        step = Step(sends=pending, before=tick[0])
        step.recvs = [n for n in (needs(actions[i], rank, p, S, placement) for i in tick) if n is not None]
        if step:
            steps.append(step)
        pending = [o for o in (produces(actions[i], rank, p, S, placement) for i in tick) if o is not None]
    if pending:
        steps.append(Step(sends=pending))
    return steps


def plan(schedule, placement: str = "loop") -> list[list[Step]]:
    """Steps of every rank for ``schedule`` (one action list per rank, p >= 2 ranks), its stages
    placed by ``placement`` (``placement.py``).

    Megatron's two batchings are tried in turn (non-interleaved, then interleaved); the first one
    that :func:`check` proves safe is returned. Raises ValueError if neither is, or if a rank uses a
    locally handed-off tensor before it makes it (:func:`check_local`).
    """
    p = len(schedule)
    v = 1 + max(a.chunk for acts in schedule for a in acts)
    check_local(schedule, placement)
    errors = []
    for ticks in (per_action_ticks, interleaved_ticks):
        steps = [rank_steps(acts, r, p, v, ticks, placement) for r, acts in enumerate(schedule)]
        try:
            check(steps)
            return steps
        except ValueError as e:
            errors.append(f"{ticks.__name__}: {e}")
    raise ValueError("no NCCL-safe batching of this schedule's p2p: " + " | ".join(errors))


def check(steps: list[list[Step]]) -> None:
    """Run the steps under rendezvous semantics; raise ValueError on a deadlock or a mismatch.

    Between each ordered pair (src, dst) messages match first to first (as on NCCL). A step's
    operation completes while both it and its peer's matching operation are posted; a rank moves to
    its next step once every operation of its current step has completed.
    """
    p = len(steps)
    # the n-th send src->dst pairs with the n-th recv dst<-src: number them
    sent, recvd = defaultdict(list), defaultdict(list)
    where = {}   # (kind, src, dst, n) -> (rank, step index)
    for r, rs in enumerate(steps):
        for k, st in enumerate(rs):
            for peer, msg in st.sends:
                n = len(sent[(r, peer)])
                sent[(r, peer)].append(msg)
                where[("send", r, peer, n)] = (r, k)
            for peer, msg in st.recvs:
                n = len(recvd[(peer, r)])
                recvd[(peer, r)].append(msg)
                where[("recv", peer, r, n)] = (r, k)
    for pair in set(sent) | set(recvd):
        if sent[pair] != recvd[pair]:
            a, b = sent[pair], recvd[pair]
            n = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            got = str(a[n]) if n < len(a) else "nothing"
            want = str(b[n]) if n < len(b) else "nothing"
            raise ValueError(f"p2p order mismatch from rank {pair[0]} to rank {pair[1]}: message "
                             f"{n} is the {got}, but the receiver expects the {want}")
    ops_of = defaultdict(list)                       # (rank, step) -> its operations
    for key, pos in where.items():
        ops_of[pos].append(key)
    cur, done = [0] * p, set()
    while any(cur[r] < len(steps[r]) for r in range(p)):
        for r in range(p):                           # complete operations whose peer is posted too
            for op, src, dst, n in ops_of.get((r, cur[r]), []):
                mate = ("recv" if op == "send" else "send", src, dst, n)
                peer, k = where[mate]
                if cur[peer] == k:
                    done |= {(op, src, dst, n), mate}
        moved = False
        for r in range(p):                           # leave completed steps
            while cur[r] < len(steps[r]) and all(key in done for key in ops_of[(r, cur[r])]):
                cur[r] += 1
                moved = True
        if not moved:
            stuck = {r: _describe(steps[r][cur[r]]) for r in range(p) if cur[r] < len(steps[r])}
            raise ValueError(f"p2p deadlock: every unfinished rank waits in a step whose peer is "
                             f"not there (rank: step) {stuck}")


def _describe(step: Step) -> str:
    parts = [f"send {m} to {q}" for q, m in step.sends] + [f"recv {m} from {q}" for q, m in step.recvs]
    return "; ".join(parts)

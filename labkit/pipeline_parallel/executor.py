"""Run a pipeline schedule on this rank's model chunks: the one executor.

Chapters "Pipeline parallelism" and "Interleaved pipeline" (Narayanan et al. 2021, Sec. 2.2).
A schedule is data (``schedules.py``: one Action list per rank); its point-to-point messages are
batched into steps that cannot deadlock on NCCL and are proven so before anything runs
(``p2p_plan.py``). :func:`run_schedule` interleaves the two: before each tick it runs that tick's
step (sends of the previous tick, receives of this one, all in one ``labkit.comm.exchange``), then
computes. Every message carries its name (kind, stage, microbatch), so a receive that gets another
message than the plan says fails loudly instead of training on the wrong activation. Shapes are
known on both sides, as in Megatron (``tensor_shape``): an activation between stages is
[b, s_local, h] (``activation_shape``), a gradient has the shape of the output it belongs to.
Which virtual stage each chunk is, which rank holds the next one, and whether the hand-off stays on
this rank (a V's turn: the tensor goes straight to the next chunk's inbox, no message) is
``placement.py``'s answer.

Measurement is not in the path: the executor records a timeline only when given a ``clock``, and
counts the bytes autograd saves only when a meter is attached (``PipelineRunner.meters``; e.g.
``labkit.measure.activations.SavedTensorMeter``), which then fills the ``ScheduleRun``'s
``peak_activation_bytes`` and ``activation_bytes``.

:class:`PipelineRunner` is the runner ``labkit.parallelize`` builds when pp > 1.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Callable

import torch

from .. import comm, recompute
from ..groups import Group
from . import schedules
from .p2p_plan import Message, plan
from .placement import default_schedule, hands_off_locally, holder, placement_of, stage_of
from .schedules import Action
from .simulate import Event


@dataclass
class ScheduleRun:
    """What :func:`run_schedule` returns for one rank and one iteration."""

    loss_sum: float                      # sum over microbatches of loss / m (last stage), else 0
    events: list[Event] = field(default_factory=list)   # seconds since ``t0`` (with a clock)
    peak_activation_bytes: int = 0       # most bytes saved for backward held at once (a meter)
    peak_in_flight: int = 0              # most microbatch-chunks held at once
    activation_bytes: dict = field(default_factory=dict)  # chunk -> bytes one microbatch saves (a meter)


def _meta(msg: Message) -> tuple[int, int, int]:
    return ("FB".index(msg.kind), msg.stage, msg.microbatch)


@dataclass
class _Rank:
    """One rank's state while it runs a schedule: what :func:`run_schedule` and its steps share."""

    group: Group
    chunks: list
    microbatches: list
    placement: str
    activation_shape: Callable
    meters: tuple
    loss_scale: float
    uses_w: bool                          # zero-bubble schedules: B (input grad) and W (weight grads) apart
    loss_sum: torch.Tensor                # float64 on the chunks' device: no host sync per microbatch
    dtype: torch.dtype                    # of the messages (the parameters')
    inbox: dict = field(default_factory=dict)    # Message -> tensor received
    outbox: dict = field(default_factory=dict)   # Message -> tensor to send
    saved: dict = field(default_factory=dict)    # (mb, chunk) -> (input, output) kept for the backward

    def stage(self, a: Action) -> int:
        return stage_of(self.group.rank, a.chunk, self.group.size, len(self.chunks), self.placement)

    @property
    def num_stages(self) -> int:
        return self.group.size * len(self.chunks)

    def hand_off(self, msg: Message, t: torch.Tensor, boundary: int) -> None:
        """Pass ``t`` across the boundary of stages ``boundary`` and ``boundary + 1``: into this
        rank's inbox when both are its own (no message to itself), else into the outbox."""
        local = hands_off_locally(boundary, self.group.size, len(self.chunks), self.placement)
        (self.inbox if local else self.outbox)[msg] = t

    def shape(self, msg: Message):
        """A message's shape, known on both sides: an activation [b, s_local, h]; a gradient my output's."""
        if msg.kind == "F":
            return self.activation_shape(self.microbatches[msg.microbatch][0])
        chunk = holder(msg.stage, self.group.size, len(self.chunks), self.placement)[1]
        return self.saved[(msg.microbatch, chunk)][1].shape

    def communicate(self, pending: list, before) -> None:
        """Run the p2p steps due before action ``before`` (None: the ones after the last)."""
        while pending and pending[0].before == before:
            st = pending.pop(0)
            got = comm.exchange(self.group, [(self.outbox.pop(msg), peer, _meta(msg)) for peer, msg in st.sends],
                                [(peer, _meta(msg), self.shape(msg), self.dtype) for peer, msg in st.recvs],
                                device=self.loss_sum.device)
            self.inbox.update({msg: t for (_, msg), t in zip(st.recvs, got)})

    def forward(self, a: Action, tick) -> float:
        """F: the chunk's forward on a microbatch (the last stage's loss / m); returns its start time."""
        s, c, mb = self.stage(a), a.chunk, a.microbatch
        tokens, labels, *rest = self.microbatches[mb]
        x = tokens if s == 0 else self.inbox.pop(Message("F", s, mb)).requires_grad_()
        start = tick()
        with contextlib.ExitStack() as stack:
            for meter in self.meters:
                stack.enter_context(meter.forward(self.chunks[c], c, mb))
            out = self.chunks[c](x, labels if s == self.num_stages - 1 else None, *rest)
        if s == self.num_stages - 1:
            out = out / len(self.microbatches)              # mean over the global batch
            self.loss_sum += out.detach().double()
        else:
            self.hand_off(Message("F", s + 1, mb), out.detach(), s)
        self.saved[(mb, c)] = (x, out)
        return start

    def backward(self, a: Action, tick, dp, last: bool) -> float:
        """B (whole backward, or the input gradient only when the schedule has W) or W (weight
        gradients), inside ``dp``'s grad_sync_context (``last``: the rank's last one); returns its start."""
        s, c, mb = self.stage(a), a.chunk, a.microbatch
        x, out = self.saved[(mb, c)]
        grad = self.inbox.get(Message("B", s, mb)) if s < self.num_stages - 1 else (
            None if self.loss_scale == 1.0 else torch.full_like(out, self.loss_scale))
        start = tick()
        with dp.grad_sync_context(last) if dp is not None else contextlib.nullcontext():
            if a.kind == "B" and self.uses_w:               # input gradient only, keep the graph
                if s > 0:                                   # (recomputed regions too: grads_for)
                    with recompute.grads_for("inputs"):
                        torch.autograd.backward(out, grad, inputs=[x], retain_graph=True)
            elif a.kind == "W":                             # weight gradients (a tied output layer's too)
                # x too: a recomputed region fed by x alone hides its weights from this graph, and
                # only a path to an input makes autograd run it; B's x.grad was handed off already
                wanted = self.chunks[c].used_parameters() + ([x] if s > 0 else [])
                x.grad = None
                torch.autograd.backward(out, grad, inputs=wanted)
                x.grad = None
            else:                                           # whole backward at once
                torch.autograd.backward(out, grad)
        if a.kind == "B" and s > 0:
            self.hand_off(Message("B", s - 1, mb), x.grad, s - 1)
        if a.kind == ("W" if self.uses_w else "B"):         # activations of (mb, c) are freed
            del self.saved[(mb, c)]
            self.inbox.pop(Message("B", s, mb), None)
            for meter in self.meters:
                meter.release(c, mb)
        return start


def run_schedule(actions, steps, chunks, group: Group, microbatches, dp=None,
                 t0: float | None = None, activation_shape=None, clock=None, placement: str = "loop",
                 meters=(), loss_scale: float = 1.0) -> ScheduleRun:
    """Run this rank's ``actions`` with its p2p ``steps`` (``p2p_plan.plan(schedule)[rank]``) on
    its ``chunks`` ([chunk 0, chunk 1, ...], each a ``labkit.model.GPT`` part), their stages
    placed by ``placement``. ``activation_shape(tokens) -> shape`` of the hidden states between
    stages (default [b, s, h]). ``clock``: timestamps of the events (None: no timeline);
    ``labkit.launcher.now`` synchronizes a CUDA device first, so that GPU timelines show work done,
    not work queued. ``meters``: objects with ``forward(chunk, c, mb)`` (a context manager around
    the forward) and ``release(c, mb)`` (its activations freed), e.g. a SavedTensorMeter.
    ``loss_scale``: the last stage's backward starts from it instead of 1 (fp16 loss scaling).

    ``microbatches``: [(tokens, labels[, position_ids])] of this data-parallel rank (only the first
    stage reads tokens, only the last labels). ``dp``: its ``grad_sync_context`` wraps each
    backward (None: no DP). Each loss is divided by m, so gradients accumulate to those of the mean
    loss over the global batch.
    """
    param, h = next(chunks[0].parameters()), chunks[0].cfg.hidden_size
    uses_w = any(a.kind == "W" for a in actions)
    rank = _Rank(group, chunks, microbatches, placement, activation_shape or (lambda tokens: (*tokens.shape, h)),
                 meters, loss_scale, uses_w, torch.zeros((), dtype=torch.float64, device=param.device), param.dtype)
    last_bwd = max(i for i, a in enumerate(actions) if a.kind == ("W" if uses_w else "B"))
    tick = clock or (lambda: 0.0)
    t0 = tick() if t0 is None else t0
    run, pending = ScheduleRun(0.0), list(steps)
    for i, a in enumerate(actions):
        rank.communicate(pending, i)
        start = rank.forward(a, tick) if a.kind == "F" else rank.backward(a, tick, dp, i == last_bwd)
        if clock is not None:
            run.events.append(Event(group.rank, a, start - t0, clock() - t0))
        run.peak_in_flight = max(run.peak_in_flight, len(rank.saved))
    rank.communicate(pending, None)
    run.loss_sum = float(rank.loss_sum)                     # one host sync per iteration
    for meter in meters:
        meter.finish(run)
    return run


class PipelineRunner:
    """``labkit.parallelize`` runner for pp > 1: this rank's chunks and the schedule that runs them.

    ``schedule``: a name of ``placement.SCHEDULES`` (``TrainConfig.schedule_name()``, the one the
    chunks were cut for: ``stage.split``; None: 1F1B, Megatron's interleaved 1F1B when v > 1), which
    also fixes where the stages sit; or a builder ``f(p, m) -> schedule`` (``schedules.gpipe``,
    ``zb_h1``, a student's) to compare schedules on the same model (``schedule_fn`` may be set
    later, as the labs do). A builder's actions run on the placement of the named schedule the
    chunks were cut for (``placement``), and must use as many chunks as this rank holds. The p2p
    plan of each (schedule, m) is derived and checked once, then cached. ``clock``: record a
    timeline (``last_run.events``); ``meters``: measurements to attach (see :func:`run_schedule`).
    """

    def __init__(self, chunks: list, groups: dict, schedule=None, activation_shape=None, clock=None):
        self.chunks, self.pp, self.activation_shape, self.clock = chunks, groups["pp"], activation_shape, clock
        self.computes_loss = chunks[-1].output_layer is not None
        name = schedule if isinstance(schedule, str) else None
        self.schedule_name = name or default_schedule(len(chunks))
        self.schedule_fn = None if isinstance(schedule, str) else schedule
        self.meters: list = []
        self.last_run: ScheduleRun | None = None
        self._plans: dict[int, tuple] = {}

    @property
    def placement(self) -> str:
        """Where the stages sit: the named schedule's placement, whichever actions run on them."""
        return placement_of(self.schedule_name)

    def schedule(self, m: int):
        p, v = self.pp.size, len(self.chunks)
        sched = self.schedule_fn(p, m) if self.schedule_fn is not None else schedules.build(self.schedule_name, p, v, m)
        used = 1 + max(a.chunk for acts in sched for a in acts)
        if used != v:
            raise ValueError(f"the schedule uses {used} model chunk(s) per rank, but this rank holds {v} "
                             f"(placement {self.placement!r})")
        return sched

    def plan(self, m: int) -> tuple[list[Action], list]:
        """(this rank's actions, its p2p steps) for m microbatches."""
        key = (m, self.schedule_fn)
        if key not in self._plans:
            sched = self.schedule(m)
            self._plans[key] = (sched[self.pp.rank], plan(sched, self.placement)[self.pp.rank])
        return self._plans[key]

    def forward_backward(self, microbatches, dp, t0: float | None = None, loss_scale: float = 1.0) -> float:
        actions, steps = self.plan(len(microbatches))
        self.last_run = run_schedule(actions, steps, self.chunks, self.pp, microbatches, dp, t0,
                                     self.activation_shape, self.clock, self.placement, self.meters,
                                     loss_scale)
        return self.last_run.loss_sum

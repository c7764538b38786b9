"""Process groups derived from a Topology, each carrying its own communication counters.

A :class:`Group` is what every collective in :mod:`labkit.comm` takes as its first argument: the
torch ProcessGroup, this rank's index in it, a :class:`CommStats` that counts calls and bytes
per op, and a :class:`CallLog` of when each of its last calls entered and returned. There is no module-level registry: the counters live on the group object you hold, so a
lab reads ``groups["tp"].stats`` and a test that builds new groups starts from zero.

    topo = Topology(8, tp=2, pp=2)
    groups = build_groups(topo)          # on every rank, same order: torch requires it
    groups["tp"].ranks, groups["tp"].rank, groups["tp"].size
"""
from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from .topology import AXES, Topology


@dataclass
class CommStats:
    """Calls and bytes sent by this rank, per op, under the textbook algorithm of each op.

    Bytes are those the ring (or pairwise) algorithm makes one rank send: all-reduce 2(n-1)/n*N,
    all-gather / reduce-scatter / all-to-all (n-1)/n*N, broadcast N from the root, send N, where N
    is the size of the full (unsharded) tensor. ``labkit.calc.comm`` has the same formulas.
    """

    calls: dict = field(default_factory=lambda: defaultdict(int))
    bytes: dict = field(default_factory=lambda: defaultdict(float))

    def add(self, op: str, nbytes: float) -> None:
        self.calls[op] += 1
        self.bytes[op] += nbytes

    def reset(self) -> None:
        self.calls.clear()
        self.bytes.clear()

    def snapshot(self) -> dict:
        """{op: {"calls": int, "bytes": float}} — plain data, safe to return from a rank."""
        return {op: {"calls": self.calls[op], "bytes": self.bytes[op]} for op in sorted(self.calls)}

    @property
    def total_bytes(self) -> float:
        return sum(self.bytes.values())


class CallLog:
    """The last ``size`` calls this rank made on one group: a ring buffer that stays on (chapter
    "When training goes wrong", section "The slow rank").

    Each entry is ``(seq, op, t_enter, t_exit, nbytes, peers)``: ``seq`` counts the group's calls
    from 0 (the same call has the same ``seq`` on every member: labkit issues collectives in the
    same order on every rank), the two times are ``time.perf_counter()`` (CLOCK_MONOTONIC: one
    clock for every process of a machine), ``nbytes`` what this rank received (collectives) or
    sent (p2p), ``peers`` the global ranks of a p2p batch's sends and receives. Overhead: two clock
    reads and one list store per call (tests/bench_call_log.py). On a GPU the times are the host's:
    when the call was issued and when it returned, not when NCCL's kernel ran.
    """

    __slots__ = ("size", "buf", "seq", "clock")

    def __init__(self, size: int = 4096):
        self.size, self.buf, self.seq, self.clock = size, [None] * size, 0, time.perf_counter

    def add(self, op: str, t_enter: float, nbytes: float = 0, peers=None) -> None:
        """Record a call that entered at ``t_enter`` and returns now."""
        self.buf[self.seq % self.size] = (self.seq, op, t_enter, self.clock(), nbytes, peers)
        self.seq += 1

    def entries(self) -> list[tuple]:
        """The kept entries, oldest first (at most ``size``)."""
        if self.seq <= self.size:
            return self.buf[:self.seq]
        i = self.seq % self.size
        return self.buf[i:] + self.buf[:i]

    def clear(self) -> None:
        self.buf, self.seq = [None] * self.size, 0


@dataclass(eq=False)
class Group:
    """One process group as seen from this rank."""

    name: str
    ranks: tuple[int, ...]
    pg: object | None  # torch ProcessGroup; None for a group of one rank (no communication)
    stats: CommStats = field(default_factory=CommStats)
    log: CallLog | None = field(default_factory=CallLog)   # None: calls not logged (bookkeeping)

    @property
    def size(self) -> int:
        return len(self.ranks)

    @property
    def rank(self) -> int:
        """This process's index inside the group (not its global rank)."""
        return self.ranks.index(dist.get_rank()) if self.size > 1 else 0

    def global_rank(self, group_rank: int) -> int:
        return self.ranks[group_rank]

    def __repr__(self) -> str:
        return f"Group({self.name!r}, ranks={list(self.ranks)})"


def subgroup_kwargs() -> dict:
    """{"timeout": the launch's collective timeout} in a rank of ``labkit.launch`` (or torchrun):
    ``dist.new_group`` without a timeout takes PyTorch's default (30 min for gloo), not the
    world group's, so a hang in a subgroup would outlast ``collective_timeout``."""
    from .launch_rank import state
    return {"timeout": state.collective_timeout} if state.collective_timeout is not None else {}


def new_group(name: str, ranks, made: dict | None = None) -> Group:
    """A Group over ``ranks``. Every rank of the world must call this, in the same order.

    ``made`` ({ranks: torch ProcessGroup}): reuse a communicator already made over the same ranks
    (the expert axes often span the same ranks as a dense one); the Group keeps its own counters."""
    ranks = tuple(int(r) for r in ranks)
    if made is not None and ranks in made:
        return Group(name, ranks, made[ranks])
    pg = dist.new_group(list(ranks), **subgroup_kwargs()) if len(ranks) > 1 else None
    if made is not None:
        made[ranks] = pg
    return Group(name, ranks, pg)


def build_groups(topo: Topology, axes=tuple(AXES), embedding_ranks=None) -> dict[str, Group]:
    """This rank's group on each axis of ``topo``: {"tp": Group, "dp": Group, ..., "embd": Group
    (the ranks holding the first and the last pipeline stage, ``embedding_ranks`` of each pp group:
    ``TrainConfig.embedding_ranks()``, default the loop placement's; only on those ranks, when
    pp > 1; one rank under the V placement), "world": Group}.

    Creates every group of every axis on every rank (torch.distributed requires all ranks to take
    part in each ``new_group`` call), and keeps the one containing this rank. Each group's
    communicator is then made at once by one tiny uncounted all-reduce, in the same order on every
    rank: under NCCL a communicator created lazily by a first point-to-point call blocks until
    the peer joins, which hangs a ring of "send, then receive" (PyTorch's batch_isend_irecv notes).
    """
    if dist.get_world_size() != topo.world_size:
        raise ValueError(f"topology is for {topo.world_size} ranks but the world has "
                         f"{dist.get_world_size()}")
    me, mine, made = dist.get_rank(), {}, {}
    for axis in axes:
        for ranks in topo.groups(axis):
            g = new_group(axis, ranks, made)
            if me in ranks:
                mine[axis] = g
    for ranks in topo.embedding_groups(embedding_ranks):
        g = new_group("embd", ranks)
        if me in ranks:
            mine["embd"] = g
    mine["world"] = world_group()
    for g in {id(g.pg): g for g in mine.values()}.values():   # each communicator once
        _connect(g)
    return mine


def add_kv_groups(groups: dict[str, Group], topo: Topology, num_query_groups: int) -> None:
    """With fewer query groups g than tp ranks, the t/g consecutive tp ranks sharing one K/V group
    (Megatron's ``tp_rank // (t / g)``) sum its gradient: add that group as ``groups["tp_kv"]``.
    Every rank calls this, in the same order (torch.distributed requires it)."""
    t = topo.tp
    if num_query_groups >= t or "tp_kv" in groups:
        return
    share, me = t // num_query_groups, dist.get_rank()
    for tp_ranks in topo.groups("tp"):
        for k in range(0, t, share):
            g = new_group("tp_kv", tp_ranks[k:k + share])
            if me in g.ranks:
                _connect(g)
                groups["tp_kv"] = g


def _connect(group: Group) -> None:
    """Create the group's communicator now (an uncounted 1-element all-reduce)."""
    if group.size > 1:
        from .launcher import device
        dist.all_reduce(torch.zeros(1, device=device()), group=group.pg)


def grad_reduce_group(groups: dict[str, Group]) -> Group:
    """The group dense gradients are averaged over: dp, or dp x cp under context parallelism
    (every rank holding the same weights; Megatron's ``get_data_parallel_group(with_context_parallel=True)``)."""
    cp = groups.get("cp")
    return groups["dp_cp"] if cp is not None and cp.size > 1 else groups["dp"]


def expert_grad_reduce_group(groups: dict[str, Group]) -> Group:
    """The group expert gradients are reduced over: the expert-data-parallel ranks, which hold the
    same experts (Megatron's ``get_expert_data_parallel_group``)."""
    return groups["edp"]


def uncounted(group: Group) -> Group:
    """The same process group with its own, separate counters: for logging and checks, so the
    bytes a lab compares with labkit.calc are training traffic only."""
    return Group(group.name + ":bookkeeping", group.ranks, group.pg, log=None)


def world_group() -> Group:
    """All ranks, as a Group (uses the default process group)."""
    n = dist.get_world_size()
    return Group("world", tuple(range(n)), dist.group.WORLD if n > 1 else None)

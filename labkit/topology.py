"""Topology: how `world_size` ranks are laid out on the parallel axes (chapter "Collectives").

A pure, frozen value. It answers "which coordinates does rank r have?" and "which ranks form
each tp/cp/ep/dp/pp group?" without touching torch.distributed, so it is unit-tested with no
processes and the same object validates a configuration before anything is launched.

Rank order follows Megatron-LM's default ``order="tp-cp-ep-dp-pp"``: tp varies fastest, pp
slowest (Megatron-LM ``parallel_state.RankGenerator``). TP innermost keeps its chatty all-reduces
on neighbouring GPUs of one node; PP outermost lets stages sit on different nodes.

    rank = tp_rank + tp * (cp_rank + cp * (dp_rank + dp * pp_rank))

Expert parallelism (chapter "Expert parallelism") does not add GPUs. Megatron lays the expert
layers out on a second grid of the same ranks (``expert_decoder_rank_generator`` in
``parallel_state.initialize_model_parallel``, d98e8a64), order tp-ep-dp-pp with the expert
tensor-parallel size etp (default tp) and the expert-data-parallel size edp = world / (etp*ep*pp):

    rank = etp_rank + etp * (ep_rank + ep * (edp_rank + edp * pp_rank))

With etp = tp the ep ranks are carved out of the dp x cp ranks (cp fastest); with etp = 1 out of
the tp x cp x dp ranks. Attention and dense layers use the first grid, experts the second.

    >>> t = Topology(16, tp=2, pp=4)
    >>> t.dp, t.coords(5)
    (2, {'tp': 1, 'cp': 0, 'ep': 0, 'dp': 0, 'pp': 1})
    >>> t.groups("pp")[:2]
    [[0, 4, 8, 12], [1, 5, 9, 13]]
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from .validate import positive_int

ORDER = ("tp", "cp", "dp", "pp")           # the dense grid, fastest first
EXPERT_ORDER = ("etp", "ep", "edp", "pp")  # the expert grid, fastest first
# Public axes and the storage axes each spans. "dp_cp" is the group gradients are averaged over
# when CP > 1 (every rank holding the same weights); "mp" is the model-parallel group tp x pp.
# Expert axes: "ep" (experts spread), "edp" (expert weights replicated: their gradients are
# reduced here), "etp" (each expert cut), "etp_ep" (Megatron's tp_ep group: the all-gather
# dispatcher's).
AXES = {
    "tp": ("tp",),
    "cp": ("cp",),
    "ep": ("ep",),
    "dp": ("dp",),
    "pp": ("pp",),
    "dp_cp": ("cp", "dp"),
    "mp": ("tp", "pp"),
    "edp": ("edp",),
    "etp": ("etp",),
    "etp_ep": ("etp", "ep"),
}


@dataclass(frozen=True)
class Topology:
    """Sizes of the parallel axes of ``world_size`` ranks; ``dp`` is derived.

    Raises ``ValueError`` if world_size is not divisible by tp*pp*cp, or by etp*ep*pp.
    """

    world_size: int
    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1
    etp: int | None = None  # expert tensor-parallel size; None: tp (Megatron's default)
    dp: int = field(init=False)

    def __post_init__(self):
        if self.etp is None:
            object.__setattr__(self, "etp", self.tp)
        for name in ("world_size", "tp", "pp", "cp", "ep", "etp"):
            positive_int(name, getattr(self, name))
        model_parallel = self.tp * self.pp * self.cp
        if self.world_size % model_parallel:
            raise ValueError(
                f"world_size {self.world_size} is not divisible by tp*pp*cp = "
                f"{self.tp}*{self.pp}*{self.cp} = {model_parallel}")
        dp = self.world_size // model_parallel
        if self.world_size % (self.etp * self.ep * self.pp):
            carved = (f"data-parallel size {dp} x context-parallel size {self.cp} is not divisible by "
                      f"ep {self.ep}: expert-parallel ranks are carved out of the dp x cp ranks"
                      if self.etp == self.tp else "")
            raise ValueError(f"world_size {self.world_size} is not divisible by etp*ep*pp = "
                             f"{self.etp}*{self.ep}*{self.pp} (the expert grid); {carved}")
        object.__setattr__(self, "dp", dp)

    # -- sizes and strides ------------------------------------------------------------------
    @property
    def edp(self) -> int:
        """Expert-data-parallel size: ranks holding the same expert weights."""
        return self.world_size // (self.etp * self.ep * self.pp)

    @property
    def _sizes(self) -> dict[str, int]:
        return {"tp": self.tp, "cp": self.cp, "dp": self.dp, "pp": self.pp,
                "etp": self.etp, "ep": self.ep, "edp": self.edp}

    def _order(self, axes) -> tuple[str, ...]:
        """The grid ``axes`` live on (dense or expert); an axis mixing both is an error."""
        for order in (ORDER, EXPERT_ORDER):
            if set(axes) <= set(order):
                return order
        raise ValueError(f"axes {axes} mix the dense and the expert grid")

    def _strides(self, order) -> dict[str, int]:
        strides, s = {}, 1
        for axis in order:
            strides[axis] = s
            s *= self._sizes[axis]
        return strides

    def size(self, axis: str) -> int:
        """Number of ranks in one group of ``axis`` (e.g. ``size("dp") == self.dp``)."""
        return math.prod(self._sizes[a] for a in self._axis(axis))

    # -- queries ----------------------------------------------------------------------------
    def coords(self, rank: int) -> dict[str, int]:
        """Coordinates of ``rank``: {"tp", "cp", "ep", "dp", "pp"} -> index along that axis."""
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < self.world_size:
            raise ValueError(f"rank must be in [0, {self.world_size}), got {rank!r}")
        strides = self._strides(ORDER)
        raw = {a: (rank // strides[a]) % self._sizes[a] for a in ORDER}
        return {"tp": raw["tp"], "cp": raw["cp"], "ep": self.expert_coords(rank)["ep"],
                "dp": raw["dp"], "pp": raw["pp"]}

    def expert_coords(self, rank: int) -> dict[str, int]:
        """Coordinates of ``rank`` on the expert grid: {"etp", "ep", "edp", "pp"}."""
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < self.world_size:
            raise ValueError(f"rank must be in [0, {self.world_size}), got {rank!r}")
        strides = self._strides(EXPERT_ORDER)
        return {a: (rank // strides[a]) % self._sizes[a] for a in EXPERT_ORDER}

    def groups(self, axis: str) -> list[list[int]]:
        """All groups of ``axis`` as sorted rank lists, ordered by their first rank.

        Ranks in one group differ only in their coordinates along ``axis``.
        """
        inner = self._axis(axis)
        order = self._order(inner)
        outer = [a for a in order if a not in inner]
        out = []
        for base in self._enumerate(outer, order):
            out.append(sorted(base + off for off in self._enumerate(inner, order)))
        return sorted(out)

    def group_of(self, axis: str, rank: int) -> list[int]:
        """The group of ``axis`` that contains ``rank``."""
        self.coords(rank)  # validates rank
        return next(g for g in self.groups(axis) if rank in g)

    def embedding_groups(self, pp_ranks=None) -> list[list[int]]:
        """Megatron's embedding groups: in each pp group, the ranks holding the first and the last
        stage (the two copies of a tied word embedding). ``pp_ranks``: their pipeline ranks, the
        placement's answer (``placement.embedding_ranks``; default the loop's: first and last); one
        rank under the V placement. Empty without pipeline parallelism."""
        from .pipeline_parallel.placement import embedding_ranks
        if self.pp == 1:
            return []
        ranks = embedding_ranks(self.pp) if pp_ranks is None else pp_ranks
        return [[g[i] for i in ranks] for g in self.groups("pp")]

    def describe(self) -> str:
        return (f"world {self.world_size} = tp {self.tp} x cp {self.cp} x dp {self.dp} "
                f"x pp {self.pp}" + (f"; experts: etp {self.etp} x ep {self.ep} x edp {self.edp} "
                                     f"x pp {self.pp}" if self.ep > 1 or self.etp != self.tp else ""))

    # -- helpers ----------------------------------------------------------------------------
    @staticmethod
    def _axis(axis: str) -> tuple[str, ...]:
        if axis not in AXES:
            raise ValueError(f"unknown axis {axis!r}; expected one of {sorted(AXES)}")
        return AXES[axis]

    def _enumerate(self, axes, order) -> list[int]:
        """Rank offsets of every combination of indices along ``axes`` (others at 0)."""
        strides, offsets = self._strides(order), [0]
        for a in axes:
            offsets = [o + i * strides[a] for o in offsets for i in range(self._sizes[a])]
        return offsets

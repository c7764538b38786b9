"""Topology: how `world_size` ranks are laid out on the parallel axes (chapter "Collectives").

A pure, frozen value. It answers "which coordinates does rank r have?" and "which ranks form
each tp/cp/ep/dp/pp group?" without touching torch.distributed, so it is unit-tested with no
processes and the same object validates a configuration before anything is launched.

Rank order follows Megatron-LM's default ``order="tp-cp-ep-dp-pp"``: tp varies fastest, pp
slowest (Megatron-LM ``parallel_state.RankGenerator``). TP innermost keeps its chatty all-reduces
on neighbouring GPUs of one node; PP outermost lets stages sit on different nodes.

    rank = tp_rank + tp * (cp_rank + cp * (dp_rank + dp * pp_rank))

Expert parallelism (no chapter yet; see the glossary) does not add GPUs: like Megatron it subdivides
the data-parallel ranks, ``dp_rank = ep_rank + ep * edp_rank``, so ep must divide dp.

    >>> t = Topology(16, tp=2, pp=4)
    >>> t.dp, t.coords(5)
    (2, {'tp': 1, 'cp': 0, 'ep': 0, 'dp': 0, 'pp': 1})
    >>> t.groups("pp")[:2]
    [[0, 4, 8, 12], [1, 5, 9, 13]]
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

ORDER = ("tp", "cp", "ep", "edp", "pp")  # storage order, fastest first; "edp" = dp // ep
# Public axes and the storage axes each spans. "dp_cp" is the group gradients are averaged over
# when CP > 1 (every rank holding the same weights); "mp" is the model-parallel group tp x pp.
AXES = {
    "tp": ("tp",),
    "cp": ("cp",),
    "ep": ("ep",),
    "dp": ("ep", "edp"),
    "pp": ("pp",),
    "dp_cp": ("cp", "ep", "edp"),
    "mp": ("tp", "pp"),
}


def _positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return value


@dataclass(frozen=True)
class Topology:
    """Sizes of the parallel axes of ``world_size`` ranks; ``dp`` is derived.

    Raises ``ValueError`` if world_size is not divisible by tp*pp*cp, or dp by ep.
    """

    world_size: int
    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1
    dp: int = field(init=False)

    def __post_init__(self):
        for name in ("world_size", "tp", "pp", "cp", "ep"):
            _positive_int(name, getattr(self, name))
        model_parallel = self.tp * self.pp * self.cp
        if self.world_size % model_parallel:
            raise ValueError(
                f"world_size {self.world_size} is not divisible by tp*pp*cp = "
                f"{self.tp}*{self.pp}*{self.cp} = {model_parallel}")
        dp = self.world_size // model_parallel
        if dp % self.ep:
            raise ValueError(
                f"data-parallel size {dp} (= world_size {self.world_size} / tp*pp*cp "
                f"{model_parallel}) is not divisible by ep {self.ep}: experts are spread over "
                f"data-parallel ranks")
        object.__setattr__(self, "dp", dp)

    # -- sizes and strides ------------------------------------------------------------------
    @property
    def _sizes(self) -> dict[str, int]:
        return {"tp": self.tp, "cp": self.cp, "ep": self.ep, "edp": self.dp // self.ep,
                "pp": self.pp}

    @property
    def _strides(self) -> dict[str, int]:
        strides, s = {}, 1
        for axis in ORDER:
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
        raw = {a: (rank // self._strides[a]) % self._sizes[a] for a in ORDER}
        return {"tp": raw["tp"], "cp": raw["cp"], "ep": raw["ep"],
                "dp": raw["ep"] + self.ep * raw["edp"], "pp": raw["pp"]}

    def groups(self, axis: str) -> list[list[int]]:
        """All groups of ``axis`` as sorted rank lists, ordered by their first rank.

        Ranks in one group differ only in their coordinates along ``axis``.
        """
        inner = self._axis(axis)
        outer = [a for a in ORDER if a not in inner]
        out = []
        for base in self._enumerate(outer):
            out.append(sorted(base + off for off in self._enumerate(inner)))
        return sorted(out)

    def group_of(self, axis: str, rank: int) -> list[int]:
        """The group of ``axis`` that contains ``rank``."""
        self.coords(rank)  # validates rank
        return next(g for g in self.groups(axis) if rank in g)

    def embedding_groups(self) -> list[list[int]]:
        """Megatron's embedding groups: the first and the last rank of each pp group (they hold the
        two copies of a tied word embedding). Empty without pipeline parallelism."""
        return [[g[0], g[-1]] for g in self.groups("pp")] if self.pp > 1 else []

    def describe(self) -> str:
        return (f"world {self.world_size} = tp {self.tp} x cp {self.cp} x dp {self.dp} "
                f"x pp {self.pp}" + (f" (ep {self.ep} within dp)" if self.ep > 1 else ""))

    # -- helpers ----------------------------------------------------------------------------
    @staticmethod
    def _axis(axis: str) -> tuple[str, ...]:
        if axis not in AXES:
            raise ValueError(f"unknown axis {axis!r}; expected one of {sorted(AXES)}")
        return AXES[axis]

    def _enumerate(self, axes) -> list[int]:
        """Rank offsets of every combination of indices along ``axes`` (others at 0)."""
        offsets = [0]
        for a in axes:
            offsets = [o + i * self._strides[a] for o in offsets for i in range(self._sizes[a])]
        return offsets

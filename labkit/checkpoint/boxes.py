"""Where a run of a rank's elements sits in the dense tensor: boxes of global offsets.

Chapter "When training goes wrong", section "Checkpoints that reshard". A rank holds, per
parameter, a local tensor cut from the dense one (its ShardPlan entry: blocks of dense indices
along ``dim``, e.g. SwiGLU's [gate_r; up_r]); the distributed optimizer holds a flat run of
elements [lo, hi) of that local tensor (a parameter may straddle two data-parallel shards). To
write either as a checkpoint in the dense model's coordinates, the run is cut into boxes, each
contiguous in memory and inside one block:

    local [6, 4] tensor, blocks (rows 0-2 -> dense 0-2, rows 3-5 -> dense 8-10), elements [5, 21):
      row 1 cols 1-3 -> dense (1, 1) size (1, 3)    rows 2-4 -> dense (2, 0) (1, 4) and (8, 0) (2, 4)
      row 5 col 0    -> dense (10, 0) size (1, 1)

Each box is (dense offsets, sizes, flat start in the local tensor, the box's local shape, and the
narrowing along ``dim`` that keeps one block). Megatron-LM's distributed-optimizer checkpoints
("fully sharded model space", ``megatron/core/dist_checkpointing``) describe the same runs as
ShardedTensors with a ``flattened_range``. Pure Python: no torch.
"""
from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Box:
    """A piece of a local tensor and where it sits in the dense one."""

    offsets: tuple            # dense offsets, one per dimension
    sizes: tuple              # the piece's shape
    at: int                   # flat index, in the local tensor, of the first element of ``local``
    local: tuple              # shape of the contiguous local run starting at ``at`` (row-major)
    narrow: tuple | None      # (dim, start, length) to keep of ``local`` (one block), or None

    @property
    def numel(self) -> int:
        return math.prod(self.sizes)


def flat_boxes(shape, lo: int, hi: int) -> list[tuple[tuple, tuple, int]]:
    """Row-major elements [lo, hi) of a tensor of ``shape`` as boxes (offsets, sizes, flat start),
    each contiguous in memory: a partial first row, whole rows, a partial last row (recursively)."""
    shape = tuple(int(s) for s in shape)
    n = math.prod(shape)
    if not 0 <= lo <= hi <= n:
        raise ValueError(f"element range [{lo}, {hi}) outside a tensor of {n} elements {shape}")
    if lo == hi:
        return []
    if len(shape) <= 1:
        return [((lo,), (hi - lo,), lo)] if shape else [((), (), 0)]
    row, rest = math.prod(shape[1:]), shape[1:]
    out, first_full = [], -(-lo // row)
    if lo % row:                                            # a partial first row
        r = lo // row
        end = min(hi, (r + 1) * row)
        out += [((r, *o), (1, *s), r * row + a) for o, s, a in flat_boxes(rest, lo - r * row, end - r * row)]
        if end == hi:
            return out
    last_full = hi // row
    if last_full > first_full:                              # whole rows
        out.append(((first_full,) + (0,) * len(rest), (last_full - first_full, *rest), first_full * row))
    if hi % row and last_full >= first_full:                # a partial last row
        out += [((last_full, *o), (1, *s), last_full * row + a)
                for o, s, a in flat_boxes(rest, 0, hi - last_full * row)]
    return out


def local_to_dense(entry, offsets, sizes) -> list[tuple[tuple, tuple, int, int, object]]:
    """A box of the local tensor -> [(dense offsets, sizes, start and length along ``entry.dim``
    inside the box, the block)], one per block it overlaps."""
    dim, out, at = entry.dim, [], 0
    lo, hi = offsets[dim], offsets[dim] + sizes[dim]
    for b in entry.blocks:                                  # block b: local [at, at + b.size)
        s, e = max(lo, at), min(hi, at + b.size)
        if s < e:
            dense = list(offsets)
            dense[dim] = b.start + (s - at)
            size = list(sizes)
            size[dim] = e - s
            out.append((tuple(dense), tuple(size), s - lo, e - s, b))
        at += b.size
    return out


def boxes(entry, lo: int = 0, hi: int | None = None, owned_only: bool = False) -> list[Box]:
    """Elements [lo, hi) of ``entry``'s local tensor (flattened; default: all of it) as boxes in
    dense coordinates. ``owned_only``: only blocks this rank owns (``Block.owner``: index 0 of
    every axis holding a copy), so that the ranks together write each dense value once."""
    shape = entry.local_shape
    hi = math.prod(shape) if hi is None else hi
    out = []
    for offsets, sizes, at in flat_boxes(shape, lo, hi):
        for dense, size, start, length, block in local_to_dense(entry, offsets, sizes):
            if owned_only and not block.owner:
                continue
            whole = length == sizes[entry.dim]
            out.append(Box(dense, size, at, sizes, None if whole else (entry.dim, start, length)))
    return out

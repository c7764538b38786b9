"""Find the first fingerprint that differs from one device, and the collective to blame.

Chapter "When training goes wrong". Order of the run (:func:`order_key`): iteration, then phase
(weights at its start, forward, backward, the finished gradients), then microbatch, then layer
(forward: embedding first; backward: the last layer first), then tensor. Each rank's record is
compared with the reference tensor cut the way the record says the rank holds it (the shard plan's
blocks, the samples and positions); the first record in that order that differs beyond float64
round-off is the divergence, and every rank that differs there is named.

Which collective: (a) with a clean run of the same layout, the first collective, on any rank,
whose op, group, shapes, input or output differ from the clean run's (its clean twin is named: a
collective a buggy run skips is still found), if it was issued no later in the run than the
divergence; else (b) the last collective the diverging rank issued since its previous fingerprint,
preferring one that moved a tensor of the diverging tensor's shape; else none (the divergence is
not a collective's: initialization, for instance).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .. import shard_plan as sp_
from .fingerprints import PHASES, layer_position

TENSORS = {"forward": ("self_attention", "mlp", "output"), "backward": ("output.grad", "mlp.grad", "self_attention.grad")}
RTOL, ATOL = 1e-9, 1e-13   # relative to the largest reference value: float64 round-off is ~1e-15


def order_key(iteration, phase, microbatch, layer, tensor_rank, num_layers) -> tuple:
    pos = layer_position(layer, num_layers)
    return (iteration, PHASES.index(phase), -1 if microbatch is None else microbatch,
            -pos if phase == "backward" else pos, tensor_rank)


def expected(rec, ref) -> torch.Tensor:
    """The reference's value of what ``rec`` holds."""
    if rec.phase in ("weights", "grads"):
        return sp_.cut(ref[rec.phase][rec.iteration][rec.entry.name], rec.entry)
    dense = ref["acts"][(rec.iteration, rec.phase, rec.layer, rec.tensor)]   # [B, s, h]
    part = dense[rec.samples[0]:rec.samples[1]]
    return part.index_select(1, torch.tensor(rec.positions)) * rec.scale


def _tensor_rank(rec, names) -> int:
    if rec.phase in ("forward", "backward"):
        return TENSORS[rec.phase].index(rec.tensor) if rec.tensor in TENSORS[rec.phase] else 9
    return names.get(rec.entry.name, 10 ** 6)


@dataclass
class Mismatch:
    key: tuple
    rank: int
    coords: dict
    record: object
    max_diff: float
    reference_max: float


def compared(ranks: list[dict], ref: dict, num_layers: int) -> list[Mismatch]:
    """Every record of every rank with its difference from the reference, in the run's order."""
    names = {n: i for i, n in enumerate(ref["weights"][0])}
    out = []
    for r in ranks:
        for rec in r["records"]:
            want = expected(rec, ref)
            got = rec.value.to(want.dtype)
            if got.shape != want.shape:
                raise ValueError(f"rank {r['rank']}: {rec.layer} {rec.tensor} has shape {tuple(got.shape)}, "
                                 f"the reference cut for it {tuple(want.shape)}")
            diff = float((got - want).abs().max()) if got.numel() else 0.0
            top = float(want.abs().max()) if want.numel() else 0.0
            key = order_key(rec.iteration, rec.phase, rec.microbatch, rec.layer, _tensor_rank(rec, names), num_layers)
            out.append(Mismatch(key, r["rank"], r["coords"], rec, diff, top))
    return sorted(out, key=lambda m: (m.key, m.rank))


def differs(m: Mismatch) -> bool:
    return m.max_diff > ATOL + RTOL * m.reference_max or m.max_diff != m.max_diff


def mismatches(ranks: list[dict], ref: dict, num_layers: int) -> list[Mismatch]:
    """Every record of every rank beyond tolerance, in the run's order."""
    return [m for m in compared(ranks, ref, num_layers) if differs(m)]


def profile(found: list[Mismatch]) -> list[tuple]:
    """[(key, phase, layer, tensor, largest relative difference over the ranks)] in the run's order."""
    out = {}
    for m in found:
        rel = m.max_diff / m.reference_max if m.reference_max else (0.0 if m.max_diff == 0 else float("inf"))
        rec = m.record
        tensor = rec.tensor if rec.phase in ("forward", "backward") else rec.entry.name
        k = (m.key, rec.phase, rec.layer, tensor, rec.microbatch)
        out[k] = max(out.get(k, 0.0), rel)
    return [(k[0], k[1], k[2], k[3], k[4], v) for k, v in sorted(out.items(), key=lambda kv: kv[0][0])]


def first_trace_difference(bad: list[dict], clean: list[dict]):
    """[(rank, index, the buggy run's collective or None, the clean run's or None)], one per rank
    whose collectives differ from the clean run's, at its first difference."""
    out = []
    for b, c in zip(bad, clean):
        ours, theirs = b["collectives"] or [], c["collectives"] or []
        for k in range(max(len(ours), len(theirs))):
            x = ours[k] if k < len(ours) else None
            y = theirs[k] if k < len(theirs) else None
            if x is None or y is None or not x.same_as(y):
                out.append((b["rank"], k, x, y))
                break
    return out


@dataclass
class Divergence:
    """Where a run first differs from one device (see the module docstring)."""

    iteration: int
    phase: str
    microbatch: int | None
    layer: str
    tensor: str
    ranks: list = field(default_factory=list)      # [{"rank", "pp", "tp", ...}] that differ there
    max_diff: float = 0.0
    reference_max: float = 0.0
    collective: object = None                      # trace.Collective, or None
    how: str = ""                                  # how the collective was found
    seconds: float = 0.0                           # the tool's wall time (first_divergence)
    profile: list = field(default_factory=list)    # compare.profile: every fingerprint's difference

    @property
    def collective_name(self) -> str | None:
        """"all_reduce on dp", or None: what a lab answer names."""
        return None if self.collective is None else f"{self.collective.op} on {self.collective.group}"

    def __str__(self) -> str:
        mb = f", microbatch {self.microbatch}" if self.microbatch is not None else ""
        who = "; ".join(", ".join(f"{k} {v}" for k, v in r.items()) for r in self.ranks[:4])
        coll = (f"\n  collective: {self.collective.describe()}\n  ({self.how})" if self.collective is not None
                else "\n  no collective before it (the values differ where they are made)")
        return (f"first divergence: iteration {self.iteration}, {self.phase}{mb}, {self.layer}, {self.tensor}\n"
                f"  ranks: {who}{' ...' if len(self.ranks) > 4 else ''}\n"
                f"  max |difference| {self.max_diff:.3g} (largest reference value {self.reference_max:.3g})"
                f"{coll}")


def _collective_key(c, num_layers) -> tuple:
    it, phase, mb, layer = c.where
    return order_key(it, phase if phase in PHASES else "step", mb, layer, -1, num_layers)


def _what(ours, theirs) -> str:
    if ours is None:
        return "this run never issued it"
    if theirs is None:
        return f"this run issued {ours.op} on {ours.group}, the clean run nothing more"
    if (ours.op, ours.group, ours.shapes) != (theirs.op, theirs.group, theirs.shapes):
        return f"this run issued {ours.op} on {ours.group} {ours.shapes} there instead"
    return "same op, another input" if ours.inputs != theirs.inputs else "same input, another output"


def blame(first: Mismatch, ranks: list[dict], clean: list[dict] | None, num_layers: int):
    """(collective or None, how) for the divergence ``first``."""
    if clean is not None:
        diffs = first_trace_difference(ranks, clean)
        if diffs:                    # earliest in the run; a changed input before a changed output
            rank, k, ours, theirs = min(diffs, key=lambda d: (
                _collective_key(d[3] or d[2], num_layers), d[2] is not None and d[3] is not None
                and d[2].inputs == d[3].inputs, d[0]))
            named = theirs or ours
            if _collective_key(named, num_layers) <= first.key:
                return named, f"rank {rank}'s collective #{k} differs from a clean run of the same layout: " \
                              + _what(ours, theirs)
    mine = next(r for r in ranks if r["rank"] == first.rank)
    before = [rec.clock for rec in mine["records"] if rec.clock < first.record.clock]
    lo = max(before) if before else -1
    window = [c for c in (mine["collectives"] or []) if lo < c.clock < first.record.clock]
    if not window:
        return None, ""
    shape = tuple(first.record.value.shape)
    fits = [c for c in window if shape in c.shapes]
    chosen = (fits or window)[-1]
    return chosen, (f"the last collective rank {first.rank} issued before the divergence"
                    + (" that moved a tensor of its shape" if fits else ""))


def first_divergence_of(ranks: list[dict], ref: dict, num_layers: int, clean: list[dict] | None = None):
    """The :class:`Divergence` of a recorded run against the reference recording, or None."""
    every = compared(ranks, ref, num_layers)
    found = [m for m in every if differs(m)]
    if not found:
        return None
    first = found[0]
    same = [m for m in found if m.key == first.key]
    rec = first.record
    collective, how = blame(first, ranks, clean, num_layers)
    return Divergence(rec.iteration, rec.phase, rec.microbatch, rec.layer, rec.tensor,
                      [{"rank": m.rank, **{k: m.coords[k] for k in ("pp", "tp", "cp", "dp") if k in m.coords}}
                       for m in same], max(m.max_diff for m in same), first.reference_max, collective, how,
                      profile=profile(every))

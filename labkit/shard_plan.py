"""The shard plan: for every parameter a rank holds, how it was cut from the dense model and what
its gradient needs. Every plan of ``labkit.parallelize`` refines it; everything after reads it.

    entry = engine.plan["decoder.layers.0.mlp.linear_fc1.weight"]
    entry.blocks     # the dense rows this rank holds, in its order: SwiGLU's [gate_r; up_r] = 2 blocks
    entry.cut        # the axis the cut is over ("tp", "etp"), or None (replicated)
    entry.dp         # the group its gradient is averaged over: "dp_cp" (dp x cp) or "edp" (experts)
    block.sums       # axes a block's gradient is summed over after that (SP norms: "tp"; a K/V group
                     # shared by TP ranks: "tp_kv"; a tied embedding on two stages: "embd")
    block.owner      # whether this rank counts the block in the global gradient norm
    entry.tags()     # the same facts as Megatron's parameter attributes (labkit/param_attrs.py)

Who reads it: the Engine's ``finalize_grads`` (the sums, in Megatron's order) and gradient norm
(the owners), the DP wrap (buckets per ``dp`` group, the experts' ``grad_scale``), ``dense_shards``
(each dense value sent once), and anything that must move a tensor between layouts: :func:`cut`
gives a rank's piece of a dense tensor, :func:`assemble` puts the pieces of every rank back
(a checkpoint saved under one layout loads under another as "assemble, then cut by the new plan").
Pure Python, except those two functions (torch, imported when called).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

SUM_ORDER = ("tp", "tp_kv", "etp", "embd")   # Megatron's finalize_model_grads: TP (SP) sums, then embd


@dataclass(frozen=True)
class Block:
    """Dense indices [start, stop) along the entry's ``dim``, held by this rank."""

    start: int
    stop: int
    replicas: tuple = ()   # ((axis, my index along it, its size), ...): ranks holding the same block
    sums: tuple = ()       # axes its gradient is a partial sum over (summed after the DP average)

    @property
    def owner(self) -> bool:
        """Counted in the norm here: index 0 along every axis that holds a copy."""
        return all(index == 0 for _, index, _ in self.replicas)

    @property
    def size(self) -> int:
        return self.stop - self.start


@dataclass(frozen=True)
class ParamShard:
    """One parameter of one rank: where its values live in the dense model, and its gradient's needs."""

    name: str                       # the dense model's name (a tied copy: the embedding's)
    shape: tuple                    # the dense (global) shape
    dim: int = 0
    blocks: tuple = ()              # in local order; () = the whole tensor
    cut: str | None = None          # "tp" / "etp": each rank of that axis holds different blocks
    dp: str = "dp_cp"               # averaged over this group first ("dp_cp", or "edp" for experts)
    dp_index: int = 0               # this rank's index in it (without ZeRO, index 0 counts the norm)
    grad_scale: float = 1.0         # before the DP average (experts: edp / (dp x cp), Megatron)
    expert: bool = False

    def __post_init__(self):
        if not self.blocks:
            object.__setattr__(self, "blocks", (Block(0, self.shape[self.dim]),))

    @property
    def local_shape(self) -> tuple:
        s = list(self.shape)
        s[self.dim] = sum(b.size for b in self.blocks)
        return tuple(s)

    def with_blocks(self, blocks, cut: str | None = None) -> "ParamShard":
        """The same parameter cut again: ``blocks`` index the current blocks' concatenation's parent
        (dense indices), each keeping the replicas and sums of the block it falls in."""
        out = []
        for b in blocks:
            parent = next(p for p in self.blocks if p.start <= b.start and b.stop <= p.stop)
            out.append(replace(b, replicas=parent.replicas + b.replicas, sums=parent.sums + b.sums))
        return replace(self, blocks=tuple(out), cut=cut or self.cut)

    def even_shard(self) -> tuple[int, int] | None:
        """(dim, rank index) when this rank holds one contiguous, equal slice of ``dim`` (what
        DTensor calls ``Shard(dim)``), else None (replicated, or fused blocks such as SwiGLU's
        [gate_r; up_r]: a DTensor layout needs the weight split into its parts first)."""
        if self.cut is None or len(self.blocks) != 1:
            return None
        b = self.blocks[0]
        n = self.shape[self.dim]
        return (self.dim, b.start // b.size) if n % b.size == 0 and b.start % b.size == 0 else None

    def with_(self, **changes) -> "ParamShard":
        """A copy with some fields changed (``dp``, ``dp_index``, ``grad_scale``, ``expert``)."""
        return replace(self, **changes)

    def cut_along(self, dim: int, blocks, axis: str) -> "ParamShard":
        """A whole tensor cut along ``dim`` into ``blocks`` over ``axis`` (replicas and sums kept)."""
        if dim != self.dim:
            if len(self.blocks) != 1 or self.blocks[0].size != self.shape[self.dim]:
                raise ValueError(f"{self.name}: already cut along dim {self.dim}, cannot cut dim {dim}")
            whole = replace(self.blocks[0], start=0, stop=self.shape[dim])
            return replace(self, dim=dim, blocks=(whole,)).with_blocks(blocks, axis)
        return self.with_blocks(blocks, axis)

    def with_replicas(self, axis: str, index: int, size: int, summed: bool = False) -> "ParamShard":
        """Every block also held by the ``size`` ranks of ``axis`` (``summed``: partial gradients)."""
        rep = ((axis, index, size),) if size > 1 else ()
        return replace(self, blocks=tuple(replace(b, replicas=b.replicas + rep,
                                                  sums=b.sums + ((axis,) if summed and size > 1 else ()))
                                          for b in self.blocks))

    # -- element ranges of the local tensor, flattened ----------------------------------------
    def _ranges(self, keep) -> list[tuple[int, int]]:
        chosen = [keep(b) for b in self.blocks]
        n = math.prod(self.local_shape)
        if all(chosen):
            return [(0, n)]
        if not any(chosen):
            return []
        if self.dim != 0:
            raise ValueError(f"{self.name}: blocks with different roles along dim {self.dim} are not "
                             f"contiguous in memory; cut such a parameter along dim 0")
        row, out, at = n // self.local_shape[0], [], 0
        for b, c in zip(self.blocks, chosen):
            if c:
                out.append((at * row, (at + b.size) * row))
            at += b.size
        return out

    def sum_axes(self) -> set:
        """Axes some block's gradient is summed over."""
        return {a for b in self.blocks for a in b.sums}

    def sum_ranges(self, axis: str) -> list[tuple[int, int]]:
        """Local elements whose gradient is summed over ``axis``."""
        return self._ranges(lambda b: axis in b.sums)

    def owned_ranges(self, dp_sharded: bool) -> list[tuple[int, int]]:
        """Local elements this rank counts in the global norm (``dp_sharded``: ZeRO, where each
        data-parallel rank counts its own shard of them)."""
        if not dp_sharded and self.dp_index != 0:
            return []
        return self._ranges(lambda b: b.owner)

    def tags(self) -> dict:
        """Megatron's parameter attributes (``labkit.param_attrs.TAGS``) for this entry."""
        sums = {a for b in self.blocks for a in b.sums}
        tags = {"tensor_model_parallel": self.cut in ("tp", "etp")}
        if tags["tensor_model_parallel"]:
            tags["partition_dim"] = self.dim
        if sums & {"tp", "etp"}:
            tags["sequence_parallel"] = True
        if "embd" in sums:
            tags["shared_embedding"] = True
            tags["shared"] = not all(b.owner for b in self.blocks)
        if self.expert:
            tags["allreduce"] = False
        return tags


class ShardPlan(dict):
    """{this rank's parameter name: ParamShard}, for every parameter of its model chunks."""

    def sum_axes(self) -> list[str]:
        """Axes some gradient is summed over, in Megatron's order (:data:`SUM_ORDER`)."""
        used = {a for e in self.values() for b in e.blocks for a in b.sums}
        return [a for a in SUM_ORDER if a in used] + sorted(used - set(SUM_ORDER))

    def describe(self) -> list[dict]:
        """One row per parameter: the plan as the book prints it."""
        return [{"parameter": n, "dense shape": e.shape, "local shape": e.local_shape,
                 "cut": f"{e.cut}, dim {e.dim}" if e.cut else "-",
                 "blocks": " + ".join(f"[{b.start}:{b.stop}]" for b in e.blocks) if e.cut else "all",
                 "grad averaged over": e.dp,
                 "then summed over": ", ".join(sorted({a for b in e.blocks for a in b.sums})) or "-",
                 "counted here": "all" if all(b.owner for b in e.blocks) else
                 ("none" if not any(b.owner for b in e.blocks) else "owned blocks")}
                for n, e in self.items()]


def initial(model, dp_index: int = 0) -> ShardPlan:
    """Every parameter of ``model`` whole, under its own name, averaged over dp x cp: the plan of a
    dense model before any strategy refines it."""
    return ShardPlan({n: ParamShard(n, tuple(p.shape), dp_index=dp_index) for n, p in model.named_parameters()})


# -- how a dense dimension is cut (pure) ---------------------------------------------------------
def contiguous(n: int, parts: int, index: int) -> tuple[Block]:
    """Rank ``index`` of ``parts``: rows [index * n/parts, (index+1) * n/parts)."""
    size = n // parts
    return (Block(index * size, (index + 1) * size),)


def stacked(n: int, stack: int, parts: int, index: int) -> tuple[Block, ...]:
    """A fused weight of ``stack`` equal parts (SwiGLU's fc1 = [gate; up]): rank ``index`` holds its
    slice of each part, [gate_r; up_r] (Megatron), not a contiguous n/parts of the stack."""
    each = n // stack
    return tuple(Block(k * each + b.start, k * each + b.stop) for k in range(stack)
                 for b in contiguous(each, parts, index))


def qkv(num_heads: int, num_groups: int, head_dim: int, parts: int, index: int) -> tuple[Block, ...]:
    """Megatron's fused QKV rows, per query group [q (heads/groups of them) | k | v] x head_dim.

    groups >= parts: rank ``index`` holds groups/parts whole groups (one block). groups < parts:
    the parts/groups ranks of a group each hold heads/parts of its query heads and a copy of its
    K and V, whose gradient is summed over those ranks (axis "tp_kv")."""
    per_group = (num_heads // num_groups + 2) * head_dim
    if num_groups >= parts:
        return contiguous(num_groups * per_group, parts, index)
    share = parts // num_groups                       # ranks per group
    g, j = divmod(index, share)
    q = (num_heads // num_groups) * head_dim // share
    base = g * per_group
    kv = Block(base + share * q, base + per_group, replicas=(("tp_kv", j, share),), sums=("tp_kv",))
    return (Block(base + j * q, base + (j + 1) * q), kv)


# -- tensors: cut a dense one for a rank, put every rank's pieces back -------------------------
def cut(dense, entry: ParamShard):
    """This rank's tensor of ``entry`` from the ``dense`` one (a new tensor)."""
    import torch
    parts = [dense.narrow(entry.dim, b.start, b.size) for b in entry.blocks]
    return torch.cat(parts, dim=entry.dim).clone()


def pieces(entry: ParamShard, local, owned_only: bool = False) -> list[tuple[int, int, object]]:
    """[(start, stop, tensor)]: the local tensor split into its blocks (``owned_only``: the blocks
    this rank counts), each with its dense range along ``entry.dim``."""
    out, at = [], 0
    for b in entry.blocks:
        if b.owner or not owned_only:
            out.append((b.start, b.stop, local.narrow(entry.dim, at, b.size)))
        at += b.size
    return out


def assemble(shape, dim: int, parts) -> object:
    """The dense tensor from ``parts`` [(start, stop, tensor)] of every rank along ``dim``; a range
    given twice (replicas) must agree. Raises ValueError naming a range nobody gave."""
    import torch
    parts = list(parts)
    out = parts[0][2].new_empty(shape)
    filled = torch.zeros(shape[dim], dtype=torch.bool)
    for start, stop, t in parts:
        out.narrow(dim, start, stop - start).copy_(t)
        filled[start:stop] = True
    if not bool(filled.all()):
        missing = (~filled).nonzero().flatten().tolist()
        raise ValueError(f"no rank holds indices {missing[:8]} of dim {dim} (shape {tuple(shape)})")
    return out


@dataclass
class Assembler:
    """Collects :func:`pieces` by dense name (from any number of ranks) and assembles them."""

    parts: dict = field(default_factory=dict)

    def add(self, entry: ParamShard, local, owned_only: bool = False) -> None:
        shape, dim, got = self.parts.setdefault(entry.name, (entry.shape, entry.dim, []))
        got.extend(pieces(entry, local, owned_only))

    def result(self) -> dict:
        return {n: assemble(shape, dim, got) for n, (shape, dim, got) in self.parts.items()}

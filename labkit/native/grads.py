"""Gradients of a PyTorch-native run: the global norm (each value counted once) and the full
gradients reassembled for parity tests.

A parameter is a DTensor on some mesh (FSDP2: ``Shard(0)`` over dp; TP: its placement over tp;
both: 2-d) or a plain tensor replicated over the axes it does not name. This rank *owns* its local
values for the norm when, on every axis where the values are copies (``Replicate`` on the mesh,
or an axis the parameter's mesh does not have at all), it has coordinate 0: labkit's
shard-plan rule (``Block.owner``), read from the DTensor's placements instead of a plan entry.
"""
from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

# the mesh dimensions that stand for each labkit axis
_AXIS_DIMS = {"dp": ("dp", "dp_replicate", "dp_shard"), "tp": ("tp",)}


def owns(t, coords: dict) -> bool:
    """Does this rank count its local part of ``t`` (a gradient) in the global norm?"""
    names = ()
    if isinstance(t, DTensor):
        names = t.device_mesh.mesh_dim_names or ()
        coord = t.device_mesh.get_coordinate()
        for name, c, pl in zip(names, coord, t.placements):
            if pl.is_replicate() and c != 0:        # a copy held by another coordinate too
                return False
    for axis, dims in _AXIS_DIMS.items():
        covered = any(d in names for d in dims)
        if not covered and coords[axis] != 0:     # replicated over an axis the mesh does not name
            return False
    return True


def finish_partial_grads(params) -> int:
    """Reduce every gradient DTensor left ``Partial`` (pending sum) to ``Replicate``; returns how
    many. Under SP the norms see [b, s/t, h] shards, so their weight gradients are partial sums
    over tp: DTensor keeps them pending until something reads them (the optimizer would). Doing it
    here, inside the counted step, is Megatron's ``finalize_model_grads`` sum over tp."""
    from torch.distributed.tensor import Replicate
    n = 0
    for p in params:
        g = p.grad
        if isinstance(g, DTensor) and any(pl.is_partial() for pl in g.placements):
            placements = [Replicate() if pl.is_partial() else pl for pl in g.placements]
            p.grad = g.redistribute(placements=placements)
            n += 1
    return n


def local(t) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


def grad_norm(params, coords: dict) -> float:
    """sqrt(sum over the world of the squares each rank owns): the global gradient norm,
    whatever the layout (one bookkeeping all-reduce over the world, not counted)."""
    sq = sum(float(local(p.grad).double().pow(2).sum()) for p in params
             if p.grad is not None and owns(p.grad, coords))
    t = torch.tensor([sq], dtype=torch.float64)
    dist.all_reduce(t)
    return math.sqrt(float(t))


def clip_(params, max_norm: float, total: float) -> None:
    """Scale every gradient by max_norm / total when total > max_norm (Megatron's clip_grad)."""
    if max_norm > 0 and total > max_norm:
        for p in params:
            if p.grad is not None:
                p.grad.mul_(max_norm / (total + 1e-6))


def full_grads(parts, coords: dict) -> list:
    """[(ParamShard of the whole tensor, full gradient on the CPU)] of every parameter of ``parts``
    (the modules this rank holds), from the ranks at dp 0 and tp 0 (every rank takes part: ``full_tensor``
    all-gathers over the parameter's mesh), in the dense model's row order (a fused weight stored
    in rank order is put back: ``tp_plan.dense_grad``): what ``labkit.parallelize.dense_shards``
    gives, so ``labkit.parallelize.assemble`` merges both implementations' the same way."""
    from ..shard_plan import ParamShard

    from .tp_plan import dense_grad
    out = []
    for part in parts:
        for name, p in part.named_parameters():
            g = p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad
            if coords["dp"] == 0 and coords["tp"] == 0:
                g = dense_grad(part, name, g.detach().cpu()).clone()
                out.append((ParamShard(name, tuple(g.shape)), g))
    return out

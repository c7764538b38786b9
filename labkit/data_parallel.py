"""Data parallelism (chapter "Data parallelism"): every rank holds the whole model, sees different
samples, and averages gradients before the optimizer step.

Foundation version: :class:`NaiveDataParallel` all-reduces every gradient after the whole backward
pass (no overlap). The bucketed, overlapping DDP and ZeRO live next to it (labkit/zero.py).

The interface every DP implementation offers the Engine (labkit/parallelize.py):
    grad_sync_context(is_last_microbatch)  context for a microbatch's backward (no_sync semantics)
    finish_grad_sync()                     after all microbatches: gradients averaged over dp
    grad_sq_sum(counts)                    sum of squared gradients this rank holds (for the norm)
    scale_grads(coef)                      gradient clipping
    step()                                 optimizer step, then gradients set to None
    grads_sharded                          True when each rank holds only a shard of the gradients
"""
from __future__ import annotations

import contextlib

import torch

from . import comm
from .groups import Group


def make_optimizer(params, cfg) -> torch.optim.Optimizer:
    """AdamW with Megatron's argument names (``lr``, ``weight_decay``, ``adam_beta1/2``, ``adam_eps``)."""
    return torch.optim.AdamW(params, lr=cfg.lr, betas=(cfg.adam_beta1, cfg.adam_beta2),
                             eps=cfg.adam_eps, weight_decay=cfg.weight_decay)


class NaiveDataParallel:
    """All-reduce (sum, then / dp) every gradient once, after the last microbatch's backward."""

    grads_sharded = False

    def __init__(self, named_params, group: Group, cfg):
        self.params = [p for _, p in named_params]
        self.group = group
        self.optimizer = make_optimizer(self.params, cfg)
        self.broadcast_parameters()

    @torch.no_grad()
    def broadcast_parameters(self) -> None:
        """Start from rank 0's weights, whatever each rank initialized (DDP does the same)."""
        if self.group.size > 1:
            for p in self.params:
                p.copy_(comm.broadcast(self.group, p.detach(), src=0))

    def grad_sync_context(self, is_last_microbatch: bool):
        return contextlib.nullcontext()  # nothing to do during backward: sync happens at the end

    @torch.no_grad()
    def finish_grad_sync(self) -> None:
        for p in self.params:
            if p.grad is not None:
                p.grad.copy_(comm.all_reduce(self.group, p.grad, op="mean"))

    @torch.no_grad()
    def grad_sq_sum(self, counts) -> float:
        return sum(float(p.grad.double().pow(2).sum()) for p in self.params
                   if p.grad is not None and counts(p))

    @torch.no_grad()
    def scale_grads(self, coef: float) -> None:
        for p in self.params:
            if p.grad is not None:
                p.grad.mul_(coef)

    def step(self) -> None:
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)


def build_data_parallel(named_params, groups: dict[str, Group], cfg):
    """The DP implementation the config asks for, over the group gradients are averaged in."""
    from .parallelize import grad_reduce_group
    group = grad_reduce_group(groups)
    return NaiveDataParallel(named_params, group, cfg)

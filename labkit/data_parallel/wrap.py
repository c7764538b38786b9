"""Data parallelism over what a rank holds: the last step of ``labkit.parallelize``.

Chapter "Data parallelism". After the pipeline split and the TP/CP/EP plans, each rank holds some
parameters (its model chunks, cut). They are averaged over the ranks that hold the same values:
dp, or dp x cp under context parallelism (``groups.grad_reduce_group``): the group each
parameter's shard-plan entry names (``labkit.shard_plan``). They are bucketed by it first: the tied
word embedding held by the first and the last pipeline stage (summed over "embd") gets a bucket
of its own, so that under ZeRO both stages shard it the same way and its gradient shards can be
summed over the embedding group element by element (Megatron-LM's
``_does_param_require_new_bucket`` in ``distributed/param_and_grad_buffer.py``).

Routed experts (entries averaged over "edp", chapter "Expert parallelism") get a bucket of their
own, reduced over the expert-data-parallel group (the ranks holding the same experts); ZeRO shards
it over that group. Megatron's scaling (``DistributedDataParallel.__init__``, d98e8a64): every
gradient must end up divided by dp x cp; the dense ones by averaging over dp x cp, the experts' by
scaling them by the entry's ``grad_scale`` = edp / (dp x cp) first (a hook on each expert
parameter), then averaging over edp.

:class:`DataParallelSet` runs one DP object per bucket behind the one interface (member.py).
"""
from __future__ import annotations

import contextlib

import torch

from .. import shard_plan as sp_
from ..groups import Group, expert_grad_reduce_group, grad_reduce_group
from .ddp import BucketedDataParallel, NaiveDataParallel
from .mixed import MixedPrecisionDataParallel
from .zero import RUNTIME_STAGES


class DataParallelSet:
    """Several DP objects (one per bucket) used as one; see the interface in member.py."""

    def __init__(self, members: list):
        self.members = members
        self.grads_sharded = any(m.grads_sharded for m in members)
        self.zero_stage = members[0].zero_stage

    @contextlib.contextmanager
    def grad_sync_context(self, is_last_microbatch: bool):
        with contextlib.ExitStack() as stack:
            for m in self.members:
                stack.enter_context(m.grad_sync_context(is_last_microbatch))
            yield

    def finish_grad_sync(self) -> None:
        for m in self.members:
            m.finish_grad_sync()

    def all_reduce_grads(self, ranges_of, group: Group) -> None:
        for m in self.members:
            m.all_reduce_grads(ranges_of, group)

    def grad_sq_sum(self, ranges_of) -> torch.Tensor:
        return sum(m.grad_sq_sum(ranges_of) for m in self.members)

    def scale_grads(self, coef: float) -> None:
        for m in self.members:
            m.scale_grads(coef)

    def step(self) -> None:
        for m in self.members:
            m.step()

    def unscale_and_check(self, inv_scale: float) -> bool:
        """Loss scaling (mixed precision): unscale every member; True if a gradient is not finite."""
        return any([m.unscale_and_check(inv_scale) for m in self.members])

    def skip(self) -> None:
        for m in self.members:
            m.skip()

    @property
    def memory(self) -> dict | None:
        """Bytes held at the last gradient sync, {"params", "grads", "optimizer"}, all buckets."""
        parts = [m.memory for m in self.members]
        return None if any(p is None for p in parts) else {k: sum(p[k] for p in parts) for k in parts[0]}

    def held_bytes(self) -> dict:
        parts = [m.held_bytes() for m in self.members]
        return {k: sum(p[k] for p in parts) for k in parts[0]}

    def full_parameters(self) -> dict[str, torch.Tensor]:
        return {n: t for m in self.members for n, t in m.full_parameters().items()}

    def full_grads(self) -> dict[str, torch.Tensor]:
        return {n: t for m in self.members for n, t in m.full_grads().items()}

    @property
    def num_params(self) -> int:
        return sum(p.numel() for m in self.members for p in m.params)


def wrap_data_parallel(chunks: list, groups: dict[str, Group], cfg, plan: sp_.ShardPlan | None = None,
                       zero_classes: dict | None = None) -> DataParallelSet:
    """The DP implementation the config asks for, over every parameter of this rank's ``chunks``,
    grouped as their shard-plan entries say (a dense plan when ``plan`` is None).

    ``zero_stage`` 1-3 (or ``use_distributed_optimizer``, stage 1) -> zero.py's ``RUNTIME_STAGES``
    (``zero_classes`` {stage: class} replaces some: the memory lab compares ZeRO3WholeModel); else
    ``ddp_bucket_size`` -> BucketedDataParallel; else NaiveDataParallel.
    """
    named = [(n, p) for chunk in chunks for n, p in chunk.named_parameters()]
    plan = plan if plan is not None else sp_.ShardPlan({n: sp_.ParamShard(n, tuple(p.shape)) for n, p in named})
    over = {"dp_cp": grad_reduce_group(groups)}
    if any(plan[n].dp == "edp" for n, _ in named):
        over["edp"] = expert_grad_reduce_group(groups)
    kind = {n: "embd" if "embd" in plan[n].sum_axes() else plan[n].dp for n, _ in named}
    buckets = [([(n, p) for n, p in named if kind[n] == k], over.get(k, over["dp_cp"]))
               for k in ("embd", "dp_cp", "edp")]
    for n, p in named:
        if plan[n].grad_scale != 1:                  # experts: Megatron's expert_gradient_scaling_factor
            p.register_hook(lambda g, s=plan[n].grad_scale: g * s)
    stage, classes = cfg.effective_zero_stage, {**RUNTIME_STAGES, **(zero_classes or {})}
    members = []
    for bucket_params, group in filter(lambda b: b[0], buckets):
        if cfg.bf16 or cfg.fp16:             # 16-bit params, fp32 masters (plain DP or ZeRO-1)
            members.append(MixedPrecisionDataParallel(bucket_params, group, cfg, distributed=stage == 1))
        elif stage:
            cls = classes[stage]
            if stage == 3 and cfg.fp8_param_gather:                     # Megatron's --fp8-param-gather
                from .fp8_gather import ZeRO3FP8Gather as cls
            members.append(cls(bucket_params, group, cfg, chunks if stage >= 2 else None))
        elif cfg.ddp_bucket_size is not None:
            members.append(BucketedDataParallel(bucket_params, group, cfg, cfg.ddp_bucket_size))
        else:
            members.append(NaiveDataParallel(bucket_params, group, cfg))
    return DataParallelSet(members)

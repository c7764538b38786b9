"""Data parallelism (chapter "Data parallelism"): every rank holds the whole model, sees different
samples, and averages gradients before the optimizer step.

Two versions side by side (picotron's DataParallelNaive / DataParallelBucket; Li et al. 2020,
"PyTorch Distributed: Experiences on Accelerating Data Parallel Training", Sec. 3.2):

- :class:`NaiveDataParallel` all-reduces every gradient, one by one, after the whole backward.
- :class:`BucketedDataParallel` groups parameters into buckets of about ``bucket_size`` elements,
  in REVERSE order of the forward pass (the order the backward produces gradients, Megatron's
  ``params[::-1]``), and starts a bucket's all-reduce as soon as its last gradient is ready, while
  the backward carries on with earlier layers: communication overlaps computation.

Both average over dp (SUM, then / dp: gloo's portable way) and accumulate gradients over the
microbatches of one global batch without communicating (PyTorch's ``no_sync``): only the backward
of the last microbatch triggers communication, once per optimizer step. Both start from rank 0's
weights (one broadcast at construction). ZeRO-1/2/3 are in zero.py; ``wrap.py`` picks one from the
config (``ddp_bucket_size``, ``zero_stage``, ``use_distributed_optimizer``).

The interface every DP implementation offers (the Engine, the checkpoints): the base class
:class:`DataParallelMember` (member.py).
"""
from __future__ import annotations

import contextlib
import time

import torch
import torch.distributed as dist

from .. import comm
from ..groups import Group
from ..validate import int_at_least
from .member import DataParallelMember
from .shard_layout import optimizer_state_bytes, storage_bytes


def make_optimizer(params, cfg) -> torch.optim.Optimizer:
    """AdamW with Megatron's argument names (``lr``, ``weight_decay``, ``adam_beta1/2``, ``adam_eps``)."""
    return torch.optim.AdamW(params, lr=cfg.lr, betas=(cfg.adam_beta1, cfg.adam_beta2),
                             eps=cfg.adam_eps, weight_decay=cfg.weight_decay)


def all_reduce_ranges(group: Group, grad: torch.Tensor, ranges) -> None:
    """Sum elements [lo, hi) of the flattened ``grad`` over ``group``, in place (``copy_``: other
    components may hold views of the gradient)."""
    flat = grad.view(-1)
    for lo, hi in ranges:
        if (lo, hi) == (0, flat.numel()):
            grad.copy_(comm.all_reduce(group, grad))
        else:
            flat[lo:hi].copy_(comm.all_reduce(group, flat[lo:hi]))


class NaiveDataParallel(DataParallelMember):
    """All-reduce (sum, then / dp) every gradient once, after the last microbatch's backward."""

    grads_sharded = False

    def __init__(self, named_params, group: Group, cfg, events: list | None = None):
        self.names = [n for n, _ in named_params]
        self.params = [p for _, p in named_params]
        self.group = group
        self.optimizer = make_optimizer(self.params, cfg)
        self.broadcast_parameters()
        self.memory = None    # {"params", "grads", "optimizer"} bytes held, set at each grad sync
        self.events = events  # a list to record (kind, label, t_start, t_end) in, for timelines

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
        for i, p in enumerate(self.params):
            if p.grad is not None:
                t0 = time.perf_counter()
                p.grad.copy_(comm.all_reduce(self.group, p.grad, op="mean"))
                if self.events is not None:
                    self.events.append(("all_reduce", f"param {i}", t0, time.perf_counter()))
        self.memory = self.held_bytes()

    def held_bytes(self) -> dict:
        """Bytes this rank holds right now (distinct storages), as calc.memory counts them."""
        return {"params": storage_bytes(self.params), "grads": storage_bytes(p.grad for p in self.params),
                "optimizer": optimizer_state_bytes(self.optimizer)}

    @torch.no_grad()
    def full_parameters(self) -> dict[str, torch.Tensor]:
        """{name: tensor}: every rank holds all of them (same interface as labkit/zero.py)."""
        return {n: p.detach().clone() for n, p in zip(self.names, self.params)}

    @torch.no_grad()
    def full_grads(self) -> dict[str, torch.Tensor]:
        """{name: gradient} after ``finish_grad_sync`` (before ``step``)."""
        return {n: p.grad.detach().clone() for n, p in zip(self.names, self.params) if p.grad is not None}

    def checkpoint_views(self) -> dict:
        """{id(p): [(name, 0, numel, 0)]}: the optimizer steps the model's own parameters, whole."""
        return {id(p): [(n, 0, p.numel(), 0)] for n, p in zip(self.names, self.params)}

    @torch.no_grad()
    def all_reduce_grads(self, ranges_of, group: Group) -> None:
        for name, p in zip(self.names, self.params):
            if p.grad is not None:
                all_reduce_ranges(group, p.grad, ranges_of(name))

    @torch.no_grad()
    def grad_sq_sum(self, ranges_of) -> torch.Tensor:
        """Sum of the squares of the gradient elements this rank counts, ``ranges_of(name)`` (a 0-d
        float64 tensor: no host sync per parameter)."""
        total = torch.zeros((), dtype=torch.float64, device=self.params[0].device)
        for name, p in zip(self.names, self.params):
            if p.grad is not None:
                flat = p.grad.reshape(-1)
                for lo, hi in ranges_of(name):
                    total += flat[lo:hi].double().pow(2).sum()
        return total

    @torch.no_grad()
    def scale_grads(self, coef: float) -> None:
        for p in self.params:
            if p.grad is not None:
                p.grad.mul_(coef)

    def step(self) -> None:
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)


def all_reduce_async(group: Group, x: torch.Tensor):
    """Start a SUM all-reduce of ``x`` IN PLACE and return its work handle (``.wait()``) at once.

    The one asynchronous collective of the course, so it lives here next to its only user; bytes
    are counted like ``comm.all_reduce`` (ring: 2(n-1)/n * N). ``x`` must be a buffer nobody else
    reads until the wait: the bucket's own flat copy of its gradients.
    """
    n = group.size
    if n == 1:
        return None
    group.stats.add("all_reduce", 2 * (n - 1) / n * x.numel() * x.element_size())
    return dist.all_reduce(x, group=group.pg, async_op=True)


class Bucket:
    """Parameters whose gradients travel together; ``buffer`` is their flat copy while in flight."""

    def __init__(self, index: int, params: list, group: Group):
        self.index, self.params, self.group = index, params, group
        self.ready: set[int] = set()   # ids of params whose gradient is final for this step
        self.buffer = None             # [numel] gradients / dp, being all-reduced
        self.work = None               # the async all-reduce's handle
        self.t_launch = None           # when its all-reduce started (timelines only)

    @property
    def numel(self) -> int:
        return sum(p.numel() for p in self.params)


def make_buckets(params, bucket_size: int, group: Group) -> list[Bucket]:
    """Fill buckets of >= ``bucket_size`` elements with params in REVERSE forward order."""
    int_at_least("bucket_size", bucket_size, 1, what="> 0 elements")
    buckets, current = [], []
    for p in reversed(params):  # the backward produces the last layer's gradients first
        current.append(p)
        if sum(q.numel() for q in current) >= bucket_size:
            buckets.append(Bucket(len(buckets), current, group))
            current = []
    if current:
        buckets.append(Bucket(len(buckets), current, group))
    return buckets


def on_grad_ready(bucket: Bucket, param: torch.Tensor) -> None:
    """The bucket hook: mark ``param`` ready; when it completes the bucket, launch the bucket's
    all-reduce of (gradients / dp) without waiting for it (the exercise of the lab)."""
    bucket.ready.add(id(param))
    if len(bucket.ready) == len(bucket.params):
        bucket.buffer = torch.cat([p.grad.reshape(-1) for p in bucket.params]) / bucket.group.size
        bucket.work = all_reduce_async(bucket.group, bucket.buffer)


class BucketedDataParallel(NaiveDataParallel):
    """All-reduce buckets of gradients DURING the backward, as they become ready (overlap).

    A post-accumulate-grad hook on every parameter calls ``hook(bucket, param)`` (default
    :func:`on_grad_ready`) when that parameter's gradient is final, i.e. only in the backward of
    the last microbatch; :meth:`finish_grad_sync` waits for the buckets and copies them back.
    """

    def __init__(self, named_params, group: Group, cfg, bucket_size: int, hook=None,
                 events: list | None = None):
        super().__init__(named_params, group, cfg, events)
        self.buckets = make_buckets(self.params, bucket_size, group)
        self.hook = hook or on_grad_ready
        self._sync = False  # True only inside the last microbatch's backward
        for b in self.buckets:
            for p in b.params:
                p.register_post_accumulate_grad_hook(lambda p, b=b: self._grad_ready(b, p))

    def _grad_ready(self, bucket: Bucket, param) -> None:
        if not self._sync:
            return  # an earlier microbatch: keep accumulating locally (no_sync)
        self.hook(bucket, param)
        if self.events is not None and bucket.work is not None and bucket.t_launch is None:
            bucket.t_launch = t0 = time.perf_counter()
            label = f"bucket {bucket.index}"
            bucket.work.get_future().then(  # runs when the all-reduce completes
                lambda fut: self.events.append(("all_reduce", label, t0, time.perf_counter())))

    @contextlib.contextmanager
    def grad_sync_context(self, is_last_microbatch: bool):
        self._sync = is_last_microbatch
        try:
            yield
        finally:
            self._sync = False

    @torch.no_grad()
    def finish_grad_sync(self) -> None:
        for b in self.buckets:
            if b.buffer is None:  # a bucket whose hook never fired (e.g. dp = 1, or unused params)
                b.buffer = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                                      for p in b.params]) / self.group.size
                b.work = all_reduce_async(self.group, b.buffer)
        for b in self.buckets:
            if b.work is not None:
                b.work.wait()
            offset = 0
            for p in b.params:  # copy the averaged gradients back (in place), then drop the buffer
                avg = b.buffer[offset:offset + p.numel()].view_as(p)
                if p.grad is None:
                    p.grad = avg.clone()
                else:
                    p.grad.copy_(avg)
                offset += p.numel()
            b.buffer, b.work, b.t_launch = None, None, None
            b.ready.clear()
        self.memory = self.held_bytes()

"""Mixed-precision data parallelism: 16-bit parameters, a main_grad buffer, fp32 master weights.

Chapter "Memory knobs". What Megatron-LM's ``DistributedDataParallel`` (its grad buffer) and
``Float16OptimizerWithFloat16Params`` / ``DistributedOptimizer`` do together
(``megatron/core/distributed/param_and_grad_buffer.py``, ``megatron/core/optimizer/``, d98e8a64):

    backward       each parameter's 16-bit gradient is added into ``param.main_grad`` (a view of
                   one flat buffer in ``precision.main_grad_dtype``: fp32 under bf16) and freed:
                   microbatches accumulate at that width
    DP             the buffer is averaged over dp (all-reduce), or reduce-scattered so each rank
                   holds the mean of its shard (``distributed``: the distributed optimizer)
    optimizer      fp32 master weights [P] (or this rank's shard [P/d]) and AdamW's two moments;
                   its gradient is main_grad in fp32 (the same memory when main_grad is fp32, a
                   copy under fp16, as Megatron's ``main_param.grad = main_grad.float()``), which a
                   loss-scaled step unscales first, and skips if a value is not finite
    after the step the masters are cast to 16-bit into the parameters (all-gathered in 16-bit
                   from their owners under the distributed optimizer)

Bytes per parameter held: 2 (parameter) + 4 (fp32 main_grad; 2 under fp16 without
``accumulate_allreduce_grads_in_fp32``) + 12 (master + moments), the 12 divided by d with the
distributed optimizer: 18 / 6 + 12/d under bf16, 16 / 4 + 12/d under fp16, as
``labkit.calc.memory.zero_memory_per_rank`` counts them. The DP interface is documented in member.py;
this class adds ``unscale_and_check`` and ``skip`` for loss scaling.
"""
from __future__ import annotations

import contextlib

import torch

from .. import comm
from ..groups import Group, uncounted
from ..precision import main_grad_dtype
from .ddp import all_reduce_ranges, make_optimizer
from .member import DataParallelMember
from .shard_layout import ShardLayout, optimizer_state_bytes, storage_bytes


def _accumulate(param) -> None:
    """After a microbatch's backward: main_grad += grad (at main_grad's width), then free grad."""
    param.main_grad.add_(param.grad)
    param.grad = None


class MixedPrecisionDataParallel(DataParallelMember):
    """16-bit parameters with fp32 masters over ``group``; ``distributed``: the optimizer state
    (masters and moments) sharded, Megatron's distributed optimizer (ZeRO-1)."""

    grads_sharded = False                # True when ``distributed`` (set in __init__)

    def __init__(self, named_params, group: Group, cfg, distributed: bool = False):
        self.names = [n for n, _ in named_params]
        self.params = [p for _, p in named_params]
        self.group, self.distributed = group, distributed
        self.grads_sharded, self.zero_stage = distributed, int(distributed)
        self.layout = ShardLayout([p.numel() for p in self.params], group.size if distributed else 1)
        self.lo, self.hi = self.layout.shard_range(group.rank if distributed else 0)
        with torch.no_grad():                               # start from rank 0's weights
            for p in self.params:
                p.copy_(comm.broadcast(group, p.detach(), src=0))
        dev = self.params[0].device
        self.main_grad = torch.zeros(self.layout.padded_numel, dtype=main_grad_dtype(cfg), device=dev)
        for p, view in zip(self.params, self.layout.views(self.main_grad, [p.shape for p in self.params])):
            p.main_grad = view
            p.register_post_accumulate_grad_hook(_accumulate)
        flat = self.layout.flatten([p.detach().float() for p in self.params])
        self.master = torch.nn.Parameter(flat[self.lo:self.hi].clone())   # fp32 [P] or [P/d]
        self.optimizer = make_optimizer([self.master], cfg)
        self.memory = None
        self._grad = None           # fp32 gradient of the masters, made from main_grad once per step

    def _g(self) -> torch.Tensor:
        """The optimizer's fp32 gradient [hi - lo] (a view of main_grad when that is fp32)."""
        if self._grad is None:
            self._grad = self.main_grad[self.lo:self.hi].float()
        return self._grad

    def grad_sync_context(self, is_last_microbatch: bool):
        return contextlib.nullcontext()      # accumulate into main_grad; sync once at the end

    @torch.no_grad()
    def finish_grad_sync(self) -> None:
        if self.group.size > 1:
            if self.distributed:             # each rank: the mean of its shard, at main_grad's width
                self.main_grad[self.lo:self.hi] = comm.reduce_scatter(self.group, self.main_grad) / self.group.size
            else:
                self.main_grad.copy_(comm.all_reduce(self.group, self.main_grad, op="mean"))
        self.memory = self.held_bytes()

    @torch.no_grad()
    def all_reduce_grads(self, ranges_of, group: Group) -> None:
        for name, p in zip(self.names, self.params):   # the whole buffer exists (as Megatron's)
            all_reduce_ranges(group, p.main_grad, ranges_of(name))

    def _read(self, ranges_of):
        """Slices of the buffer this rank's optimizer reads, within ``ranges_of(name)``."""
        for name, a in zip(self.names, self.layout.offsets):
            for r0, r1 in ranges_of(name):
                lo, hi = max(a + r0, self.lo), min(a + r1, self.hi)
                if lo < hi:
                    yield slice(lo, hi)

    @torch.no_grad()
    def grad_sq_sum(self, ranges_of) -> torch.Tensor:
        g, total = self._g(), torch.zeros((), dtype=torch.float64, device=self.main_grad.device)
        for sl in self._read(ranges_of):
            total += g[sl.start - self.lo:sl.stop - self.lo].double().pow(2).sum()
        return total

    @torch.no_grad()
    def scale_grads(self, coef: float) -> None:
        self._g().mul_(coef)

    @torch.no_grad()
    def unscale_and_check(self, inv_scale: float) -> bool:
        """The optimizer's gradient (fp32) times 1/S; True if a value is not finite."""
        g = self._g()
        g.mul_(inv_scale)
        return not bool(torch.isfinite(g).all())

    @torch.no_grad()
    def skip(self) -> None:
        """A skipped iteration (a non-finite gradient): drop the gradients, keep the weights."""
        self.main_grad.zero_()
        self._grad = None

    @torch.no_grad()
    def step(self) -> None:
        self.master.grad = self._g()
        self.optimizer.step()                                       # AdamW on the fp32 masters
        sixteen = self.master.detach().to(self.params[0].dtype)
        full = comm.all_gather(self.group, sixteen) if self.distributed and self.group.size > 1 else sixteen
        for p, v in zip(self.params, self.layout.views(full, [p.shape for p in self.params])):
            p.copy_(v)
        self.main_grad.zero_()
        self.master.grad, self._grad = None, None

    def checkpoint_views(self) -> dict:
        """{id(master): [(name, lo, hi, base)]}: master elements [base, base + hi - lo) hold elements
        [lo, hi) of parameter ``name``: labkit.checkpoint saves the fp32 masters as the weights."""
        return {id(self.master): self.layout.runs(self.names, self.lo, self.hi)}

    def held_bytes(self) -> dict:
        """Bytes this rank holds (distinct storages): 16-bit params, main_grad, masters + moments."""
        return {"params": storage_bytes(self.params), "grads": storage_bytes([self.main_grad]),
                "optimizer": storage_bytes([self.master]) + optimizer_state_bytes(self.optimizer)}

    @torch.no_grad()
    def full_parameters(self) -> dict[str, torch.Tensor]:
        return {n: p.detach().clone() for n, p in zip(self.names, self.params)}

    @torch.no_grad()
    def full_grads(self) -> dict[str, torch.Tensor]:
        """{name: the averaged, unscaled fp32 gradient} (gathered under the distributed optimizer,
        on an uncounted group)."""
        flat = self._g()
        if self.distributed and self.group.size > 1:
            flat = comm.all_gather(uncounted(self.group), flat.clone())
        views = self.layout.views(flat, [p.shape for p in self.params])
        return {n: v.clone() for n, v in zip(self.names, views)}

"""ZeRO-1, ZeRO-2 and ZeRO-3 (FSDP): data parallelism that shards what every replica used to copy.

Chapter "Data parallelism", section ZeRO. Rajbhandari et al. 2020, "ZeRO: Memory Optimizations
Toward Training Trillion Parameter Models", Fig. 1. Plain DP keeps on every rank, per parameter,
4 bytes of weight + 4 of gradient + 8 of AdamW moments (fp32 here: 16 B/param). Over dp ranks:

    stage 1 (Megatron: --use-distributed-optimizer)  optimizer states sharded   4 + 4 + 8/dp
    stage 2                                          + gradients sharded        4 + (4 + 8)/dp
    stage 3 (PyTorch: FSDP, "full shard")            + parameters sharded       (4 + 4 + 8)/dp

All three sit on one :class:`~labkit.shard_layout.ShardLayout` (parameters end to end in one flat
buffer, padded to a multiple of dp; dp rank r owns the slice [r*S, (r+1)*S)) and differ only in
what they keep whole. Per optimizer step with m microbatches, one rank sends (labkit.calc.comm):

    stage 1  reduce-scatter of the gradients once, all-gather of the updated parameters once
    stage 2  reduce-scatter after every microbatch (a full gradient is never kept), all-gather once
    stage 3  reduce-scatter after every microbatch; all-gather before every forward AND every
             backward (the parameters were freed in between), none after the step

Stage 1/2 move exactly the bytes of plain DP's all-reduce (reduce-scatter + all-gather = all-reduce);
stage 3 moves 1.5x. The DP interface is documented in member.py. With tensor parallelism each tp rank
shards its own slice of every weight (the layouts of the tp ranks are identical, so the SP sums over
tp work shard by shard); with pipelines, stage 1 only (labkit.config says why).
Teaching simplifications, said in the chapter: stage 2 here reduce-scatters once per microbatch after
its backward, and stage 3 gathers the whole model as one unit. labkit.train runs the real thing
(``fsdp.py``: ZeRO-2 bucket by bucket during the backward, ZeRO-3 a unit per layer, prefetched);
these whole-model classes stay for the data-parallelism chapter and lab, which teach with them.
"""
from __future__ import annotations

import contextlib

import torch

from .. import comm
from ..groups import Group, uncounted
from .ddp import all_reduce_ranges, make_optimizer
from .member import DataParallelMember
from .shard_layout import ShardLayout, optimizer_state_bytes, storage_bytes


class _ShardedDataParallel(DataParallelMember):
    """What the three stages share: the flat buffer, rank 0's weights, the shard's AdamW."""

    grads_sharded = True

    def __init__(self, named_params, group: Group, cfg, module=None):
        self.names = [n for n, _ in named_params]
        self.params = [p for _, p in named_params]
        self.group = group
        self.layout = ShardLayout([p.numel() for p in self.params], group.size)
        self.lo, self.hi = self.layout.shard_range(group.rank)
        # [P padded]: every parameter end to end; each param.data becomes a view of it
        self.flat = self.params[0].new_zeros(self.layout.padded_numel)
        self.layout.bind(self.params, self.flat)
        with torch.no_grad():  # start from rank 0's weights, as DDP does (one broadcast)
            self.flat.copy_(comm.broadcast(group, self.flat, src=0))
        self.memory = None  # {"params", "grads", "optimizer"} bytes held, set at each grad sync

    def _make_optimizer(self, shard: torch.Tensor, cfg) -> None:
        self.shard = torch.nn.Parameter(shard)  # [S]: the only weights this rank's AdamW updates
        self.optimizer = make_optimizer([self.shard], cfg)

    # -- what the Engine calls -------------------------------------------------------------
    def _in_shard(self, ranges_of):
        """Slices of this rank's shard [lo, hi) of the flat buffer holding the elements
        ``ranges_of(name)`` (ranges of each parameter's flattened tensor) selects."""
        for name, a in zip(self.names, self.layout.offsets):
            for r0, r1 in ranges_of(name):
                lo, hi = max(a + r0, self.lo), min(a + r1, self.hi)
                if lo < hi:
                    yield slice(lo - self.lo, hi - self.lo)

    @torch.no_grad()
    def all_reduce_grads(self, ranges_of, group: Group) -> None:
        """Sum over ``group`` the shard's elements ``ranges_of`` selects. The group's ranks hold
        the same layout (tp ranks: equal shapes; the tied embedding: its own bucket), so the
        elements line up."""
        g = self.shard.grad
        for sl in self._in_shard(ranges_of):
            g[sl] = comm.all_reduce(group, g[sl])

    @torch.no_grad()
    def grad_sq_sum(self, ranges_of) -> torch.Tensor:
        """Squares of the elements of this rank's gradient shard that ``ranges_of`` selects."""
        g = self.shard.grad
        total = torch.zeros((), dtype=torch.float64, device=g.device)
        for sl in self._in_shard(ranges_of):
            total += g[sl].double().pow(2).sum()
        return total

    @torch.no_grad()
    def full_grads(self) -> dict[str, torch.Tensor]:
        """{name: the full averaged gradient} after finish_grad_sync: gathers the shards on an
        uncounted group (tests and labs only)."""
        flat = comm.all_gather(uncounted(self.group), self.shard.grad.detach())
        views = self.layout.views(flat, [p.shape for p in self.params])
        return {n: v.clone() for n, v in zip(self.names, views)}

    @torch.no_grad()
    def scale_grads(self, coef: float) -> None:
        self.shard.grad.mul_(coef)

    def held_bytes(self) -> dict:
        """Bytes this rank holds right now (distinct storages), as calc.memory counts them."""
        return {"params": storage_bytes(self.params + [self.shard]),
                "grads": storage_bytes([p.grad for p in self.params] + [self.shard.grad]),
                "optimizer": optimizer_state_bytes(self.optimizer)}

    @torch.no_grad()
    def full_parameters(self) -> dict[str, torch.Tensor]:
        """{name: full tensor} for tests and labs; gathers under ZeRO-3 on an uncounted group."""
        flat = self.flat
        if flat.untyped_storage().nbytes() == 0:  # ZeRO-3: parameters are freed between uses
            flat = comm.all_gather(uncounted(self.group), self.shard.detach())
        views = self.layout.views(flat, [p.shape for p in self.params])
        return {n: v.clone() for n, v in zip(self.names, views)}

    def checkpoint_views(self) -> dict:
        """{id(shard): runs}: the optimizer steps this rank's shard [lo, hi) of the flat buffer."""
        return {id(self.shard): self.layout.runs(self.names, self.lo, self.hi)}

    @torch.no_grad()
    def _reduce_scatter(self, flat_grad: torch.Tensor) -> torch.Tensor:
        """[P padded] local gradient sums -> [S] this rank's shard of the mean over dp."""
        return comm.reduce_scatter(self.group, flat_grad) / self.group.size  # gloo: SUM, then / dp


class ZeRO1(_ShardedDataParallel):
    """Stage 1: optimizer states sharded. Full gradients accumulate in one flat buffer; after the
    last microbatch a reduce-scatter leaves each rank the mean of its shard; each rank updates its
    shard; an all-gather gives everyone the new weights (Megatron's distributed optimizer)."""

    zero_stage = 1

    def __init__(self, named_params, group: Group, cfg, module=None):
        super().__init__(named_params, group, cfg, module)
        self._make_optimizer(self.flat[self.lo:self.hi], cfg)  # a view: updates land in self.flat
        # [P padded] full gradients; p.grad are views, so autograd accumulates into the buffer
        self.flat_grad = torch.zeros_like(self.flat)
        for p, g in zip(self.params, self.layout.views(self.flat_grad, [p.shape for p in self.params])):
            p.grad = g

    def grad_sync_context(self, is_last_microbatch: bool):
        return contextlib.nullcontext()  # accumulate full gradients locally; sync once at the end

    @torch.no_grad()
    def all_reduce_grads(self, ranges_of, group: Group) -> None:
        """Megatron's way under the distributed optimizer: the whole gradient buffer exists, so the
        selected gradients are all-reduced whole (``finalize_model_grads`` on ``main_grad``). Only
        this rank's shard of the result is read by the step."""
        for name, p in zip(self.names, self.params):
            all_reduce_ranges(group, p.grad, ranges_of(name))

    @torch.no_grad()
    def finish_grad_sync(self) -> None:
        self.flat_grad[self.lo:self.hi] = self._reduce_scatter(self.flat_grad)
        self.shard.grad = self.flat_grad[self.lo:self.hi]   # a view, no new memory
        self.memory = self.held_bytes()

    @torch.no_grad()
    def step(self) -> None:
        self.optimizer.step()                                       # AdamW on S elements only
        self.flat.copy_(comm.all_gather(self.group, self.shard.detach()))  # [S] x dp -> [P padded]
        self.flat_grad.zero_()                                      # p.grad stay views of it


class ZeRO2(_ShardedDataParallel):
    """Stage 2: + gradients sharded. After each microbatch's backward the full gradients are
    reduce-scattered, this rank adds its shard to an [S] accumulator, and the full ones are freed."""

    zero_stage = 2

    def __init__(self, named_params, group: Group, cfg, module=None):
        super().__init__(named_params, group, cfg, module)
        self._make_optimizer(self._initial_shard(), cfg)
        self.grad_shard = torch.zeros_like(self.shard)             # [S], the only gradient kept

    def _initial_shard(self) -> torch.Tensor:
        return self.flat[self.lo:self.hi]  # a view: the optimizer's update lands in self.flat

    @contextlib.contextmanager
    def grad_sync_context(self, is_last_microbatch: bool):
        yield                                   # the microbatch's backward runs here
        self._shard_grads()                     # every microbatch: no full gradient survives it

    @torch.no_grad()
    def _shard_grads(self) -> None:
        grads = [p.grad for p in self.params]
        if all(g is None for g in grads):       # a context around a forward only (pipelines)
            return
        self.grad_shard += self._reduce_scatter(self.layout.flatten(grads))
        for p in self.params:
            p.grad = None

    def finish_grad_sync(self) -> None:
        self.shard.grad = self.grad_shard
        self.memory = self.held_bytes()

    @torch.no_grad()
    def step(self) -> None:
        self.optimizer.step()
        self.flat.copy_(comm.all_gather(self.group, self.shard.detach()))
        self.grad_shard.zero_()


class ZeRO3WholeModel(ZeRO2):
    """Stage 3 / FSDP, whole model at once (the lab's teaching version; labkit.train runs
    fsdp.ZeRO3PerLayer): + parameters sharded. The whole-model buffer is all-gathered just before the
    forward, freed after it, all-gathered again when the backward reaches the model's output, and
    freed after the backward; each rank keeps only its [S] shard of weights, gradients, moments."""

    zero_stage = 3

    def __init__(self, named_params, group: Group, cfg, module=None):
        if module is None:
            raise ValueError("ZeRO-3 needs the module, to gather its parameters around forward and backward")
        super().__init__(named_params, group, cfg, module)
        self._full_bytes = self.flat.untyped_storage().nbytes()
        self._free_params()
        for m in (module if isinstance(module, (list, tuple)) else [module]):   # every model chunk
            m.register_forward_pre_hook(lambda mod, args: self._gather_params())
            m.register_forward_hook(self._after_forward)

    def _initial_shard(self) -> torch.Tensor:
        return self.flat[self.lo:self.hi].clone()  # its own storage: the flat buffer gets freed

    @torch.no_grad()
    def _gather_params(self) -> None:
        """Re-allocate the flat storage (every param.data views it) and fill it from all shards."""
        self.flat.untyped_storage().resize_(self._full_bytes)
        self.flat.copy_(comm.all_gather(self.group, self.shard.detach()))  # [S] x dp -> [P padded]

    def _free_params(self) -> None:
        self.flat.untyped_storage().resize_(0)  # the views stay valid; their memory is gone

    def _after_forward(self, module, args, output):
        self._free_params()
        if output.requires_grad:  # the first thing the backward reaches: gather again
            output.register_hook(lambda grad: self._gather_params())

    @contextlib.contextmanager
    def grad_sync_context(self, is_last_microbatch: bool):
        with super().grad_sync_context(is_last_microbatch):
            yield                               # forward (gather, free), backward (gather)
        self._free_params()                     # after the backward: only the shard remains

    @torch.no_grad()
    def step(self) -> None:
        self.optimizer.step()        # the next forward gathers the new shards: nothing to send now
        self.grad_shard.zero_()


# the whole-model stages the data-parallelism chapter and lab teach with (labkit/check/zero.py)
ZERO_STAGES = {1: ZeRO1, 2: ZeRO2, 3: ZeRO3WholeModel}

# what labkit.train runs: ZeRO-2 bucket by bucket during the backward, ZeRO-3 a unit per layer
from .fsdp import ZeRO2Bucketed, ZeRO3PerLayer  # noqa: E402 - after the classes fsdp.py does not need

ZeRO3 = ZeRO3PerLayer
RUNTIME_STAGES = {1: ZeRO1, 2: ZeRO2Bucketed, 3: ZeRO3PerLayer}

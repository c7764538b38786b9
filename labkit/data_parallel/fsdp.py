"""ZeRO-2 and ZeRO-3 by units: a unit per transformer layer, as Megatron-FSDP and FSDP2 shard a model.

Chapter "Memory knobs" (Rajbhandari et al. 2020, ZeRO; Zhao et al. 2023, PyTorch FSDP,
https://arxiv.org/abs/2304.11277). A model chunk is cut into units: the embedding, each layer, the
head (final norm, output layer), each a flat buffer padded to a multiple of dp; dp rank r owns
chunk r of every unit (Megatron's per-bucket layout).

ZeRO-3 (:class:`ZeRO3PerLayer`): a unit's parameters exist only as this rank's shard, except
    forward   its all-gather is waited for just before the unit computes, the NEXT unit's gather
              is issued at the same moment (prefetch: it runs while this one computes), and the
              unit is freed after its forward (after its last user's: a tied output layer keeps
              the embedding's unit gathered through the forward, as FSDP keeps a root unit);
    backward  gathered again when the gradient reaches its output (prefetching the unit before it),
              its gradients reduce-scattered as soon as they are all there (during the backward),
              and freed: at any moment a rank holds its shards, about two gathered units, and the
              reduce-scatter of one unit's gradients. A recomputed forward (activation
              recomputation) runs inside the backward: it keeps its unit for the backward that
              follows and prefetches the unit before it.
ZeRO-2 (:class:`ZeRO2Bucketed`): the parameters stay whole; each unit is a gradient bucket,
    reduce-scattered during the backward as soon as its gradients are complete, so no full
    gradient of the model exists at once. After the step each unit's shards are all-gathered.

Bytes per step (labkit.calc.comm ``dp_step_bytes``): as whole-model ZeRO-2/3 (every unit gathered
twice per microbatch under ZeRO-3, every gradient reduce-scattered once per microbatch).
``with dp.recording() as rec`` (probe.py): ``rec.events`` the order of gathers, computations, frees
and reduce-scatters; ``rec.samples`` the live parameter bytes at every unit boundary (the CPU has no
allocator peak). The whole-model versions stay in zero.py, where the data-parallelism lab teaches.
"""
from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist

from .. import comm
from ..groups import Group, uncounted
from ..recompute import PHASE
from .ddp import make_optimizer
from .member import DataParallelMember
from .probe import UnitProbe
from .shard_layout import optimizer_state_bytes, storage_bytes
from .units import Unit, units_of


class _UnitSharded(DataParallelMember):
    """What ZeRO-2 and ZeRO-3 by units share; the DP interface of member.py."""

    grads_sharded = True
    frees_params = False
    split = None          # a predicate on parameters: those get units of their own (units_of)

    def __init__(self, named_params, group: Group, cfg, module=None):
        if module is None:
            raise ValueError(f"ZeRO-{self.zero_stage} needs the module, to cut it into units (one per layer)")
        self.group, self.names, self.params = group, [n for n, _ in named_params], [p for _, p in named_params]
        chunks = module if isinstance(module, (list, tuple)) else [module]
        self.units = units_of(chunks, named_params, group, not self.frees_params, self.split)
        self.unit_of = {id(p): u for u in self.units for p in u.params}
        self.optimizer = make_optimizer([u.shard for u in self.units], cfg)
        self.probe: UnitProbe | None = None   # set while a caller records (``recording``), else None
        self.memory = None
        for p in self.params:
            p.register_post_accumulate_grad_hook(self._grad_ready)

    def live_param_bytes(self) -> int:
        return storage_bytes([u.flat for u in self.units] + [u.shard for u in self.units])

    @contextlib.contextmanager
    def recording(self):
        """``with dp.recording() as rec``: rec (probe.py) holds the events and live bytes of the block."""
        self.probe = rec = UnitProbe()
        try:
            yield rec
        finally:
            self.probe = None

    def _sample(self, what: str, u: Unit) -> None:
        if self.probe is not None:                 # measured only when asked: not in the hot path
            self.probe.sample(what, u.index, self.live_param_bytes())

    # -- gradients: reduce-scatter a unit as soon as its gradients are complete ---------------------
    def _grad_ready(self, p) -> None:
        u = self.unit_of[id(p)]
        u.grads_done.add(id(p))
        if len(u.grads_done) == len(u.params):
            self._reduce_scatter(u)

    @torch.no_grad()
    def _reduce_scatter(self, u: Unit) -> None:
        grads = [p.grad for p in u.params]
        if self.probe is not None:
            self.probe.grad_samples.append(storage_bytes([p.grad for p in self.params]))
        if any(g is not None for g in grads):
            u.grad_shard += comm.reduce_scatter(self.group, u.layout.flatten(grads)) / self.group.size
        for p in u.params:
            p.grad = None
        u.grads_done.clear()
        self._sample("reduce_scatter", u)
        if self.frees_params and u.gathered:
            self._free(u)

    @contextlib.contextmanager
    def grad_sync_context(self, is_last_microbatch: bool):
        yield
        for u in self.units:        # parameters that got no gradient this microbatch (none used)
            if u.grads_done or any(p.grad is not None for p in u.params):
                self._reduce_scatter(u)
            elif self.frees_params and u.gathered:
                self._free(u)

    def finish_grad_sync(self) -> None:
        for u in self.units:
            u.shard.grad = u.grad_shard
        self.memory = self.held_bytes()

    def _slices(self, ranges_of):
        for u in self.units:
            for name, a in zip(u.names, u.layout.offsets):
                for r0, r1 in ranges_of(name):
                    lo, hi = max(a + r0, u.lo), min(a + r1, u.hi)
                    if lo < hi:
                        yield u, slice(lo - u.lo, hi - u.lo)

    @torch.no_grad()
    def all_reduce_grads(self, ranges_of, group: Group) -> None:
        for u, sl in self._slices(ranges_of):
            u.grad_shard[sl] = comm.all_reduce(group, u.grad_shard[sl])

    @torch.no_grad()
    def grad_sq_sum(self, ranges_of) -> torch.Tensor:
        total = torch.zeros((), dtype=torch.float64, device=self.params[0].device)
        for u, sl in self._slices(ranges_of):
            total += u.grad_shard[sl].double().pow(2).sum()
        return total

    @torch.no_grad()
    def scale_grads(self, coef: float) -> None:
        for u in self.units:
            u.grad_shard.mul_(coef)

    def held_bytes(self) -> dict:
        return {"params": self.live_param_bytes(),
                "grads": storage_bytes([u.grad_shard for u in self.units] + [p.grad for p in self.params]),
                "optimizer": optimizer_state_bytes(self.optimizer)}

    @torch.no_grad()
    def _gathered(self, shard_of) -> dict[str, torch.Tensor]:
        """{name: full tensor} of every unit's ``shard_of(unit)``, gathered on an uncounted group."""
        out = {}
        for u in self.units:
            flat = comm.all_gather(uncounted(self.group), shard_of(u).detach())
            out.update({n: v.clone() for n, v in zip(u.names, u.layout.views(flat, [p.shape for p in u.params]))})
        return out

    def full_parameters(self) -> dict[str, torch.Tensor]:
        return self._gathered(lambda u: u.shard)

    def full_grads(self) -> dict[str, torch.Tensor]:
        return self._gathered(lambda u: u.grad_shard)

    def checkpoint_views(self) -> dict:
        """{id(unit shard): [(name, lo, hi, base)]}: shard elements [base, base + hi - lo) hold
        elements [lo, hi) of parameter ``name`` (flattened); what labkit.checkpoint reads."""
        return {id(u.shard): u.layout.runs(u.names, u.lo, u.hi) for u in self.units}

    def _free(self, u: Unit) -> None:
        if u.work is not None:          # a prefetch still in flight writes into the buffer: finish it
            u.work.wait()
            u.work = None
        u.flat.untyped_storage().resize_(0)
        self._sample("free", u)


class ZeRO2Bucketed(_UnitSharded):
    """Stage 2: parameters whole, gradients reduce-scattered unit by unit during the backward."""

    zero_stage = 2

    @torch.no_grad()
    def step(self) -> None:
        self.optimizer.step()                     # each unit's shard is a view of its flat buffer
        for u in self.units:
            u.flat.copy_(comm.all_gather(self.group, u.shard.detach()))
            u.grad_shard.zero_()


class ZeRO3PerLayer(_UnitSharded):
    """Stage 3 / FSDP: a unit per layer gathered around its forward and its backward, prefetched."""

    zero_stage = 3
    frees_params = True

    def __init__(self, named_params, group: Group, cfg, module=None):
        super().__init__(named_params, group, cfg, module)
        for u in self.units:
            u.flat.untyped_storage().resize_(0)
            for k, m in enumerate(u.users):       # gathered from its first user's forward to its last's
                m.register_forward_pre_hook(lambda mod, args, u=u, k=k: self._before_forward(u, k == 0))
                if k == len(u.users) - 1:
                    m.register_forward_hook(lambda mod, args, out, u=u: self._after_forward(u, out))

    def _issue(self, u: Unit) -> None:
        """Start gathering ``u`` (asynchronously: the caller computes meanwhile)."""
        if u.gathered or u.work is not None:
            return
        u.flat.untyped_storage().resize_(u.full_bytes)
        n = self.group.size
        if n == 1:
            u.flat.copy_(u.shard.detach())
        else:
            self.group.stats.add("all_gather", (n - 1) / n * u.full_bytes)
            u.work = dist.all_gather_into_tensor(u.flat, u.shard.detach(), group=self.group.pg, async_op=True)
        self._sample("gather", u)

    def _wait(self, u: Unit) -> None:
        self._issue(u)
        if u.work is not None:
            u.work.wait()
            u.work = None

    def _neighbour(self, u: Unit, step: int):
        i = u.index + step
        return self.units[i] if 0 <= i < len(self.units) else None

    def _before_forward(self, u: Unit, first: bool) -> None:
        self._wait(u)               # recomputed (PHASE "again"): the backward goes on to the unit before
        nxt = self._neighbour(u, -1 if PHASE.get() == "again" else +1)
        if first and nxt is not None:
            self._issue(nxt)                      # prefetch: gathers while u computes
        self._sample("compute", u)

    def _after_forward(self, u: Unit, out) -> None:
        if PHASE.get() == "again":    # its backward follows at once: freed after the reduce-scatter
            return
        self._free(u)
        if torch.is_tensor(out) and out.requires_grad:   # the backward reaches this unit here
            out.register_hook(lambda grad, u=u: self._before_backward(u))

    def _before_backward(self, u: Unit) -> None:
        self._wait(u)
        prv = self._neighbour(u, -1)
        if prv is not None:
            self._issue(prv)                      # prefetch the unit the backward reaches next
        self._sample("compute backward", u)

    def step(self) -> None:
        self.optimizer.step()                     # the next forward gathers the new shards
        for u in self.units:
            u.grad_shard.zero_()

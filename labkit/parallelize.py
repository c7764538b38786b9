"""Apply the parallel strategies to the dense GPT in one fixed order, and run a training step.

    1. PP   split the model into this rank's stages (model chunks)          pipeline_parallel/stage.py
    2. TP   swap each chunk's modules for tensor-parallel ones, by role      tensor_parallel/plan.py
       (SP is part of the TP plan; then Megatron's dropout streams)         tensor_parallel/random.py
    3. CP   swap each chunk's core attention; shard every microbatch        context_parallel/plan.py
    4. EP   keep num_experts/ep experts of each MoE layer, swap its dispatcher expert_parallel/plan.py
    5. DP   average what the rank holds over dp (x cp); ZeRO shards it     data_parallel/wrap.py

torchtitan's order (``parallelize_llama``: pipeline split first, then TP and the rest on each
stage, data parallelism last). Each plan takes ``(chunks, groups, cfg, plan)`` and refines the
rank's :class:`~labkit.shard_plan.ShardPlan` (per parameter: its dense name and blocks, the group
its gradient is averaged over, the groups it is then summed over, who counts it in the norm).
The model itself knows nothing of this (labkit/model.py has the seams).

One :class:`Engine` runs an iteration for every combination, finishing gradients as Megatron's
``finalize_model_grads`` does (``megatron/core/distributed/finalize_model_grads.py``, d98e8a64),
reading only the plan:

    loss = runner.forward_backward(microbatches, dp)   # PP schedule, or a plain loop
    dp.finish_grad_sync()                              # DP first: average over dp (x cp), edp
    for axis in plan.sum_axes():                       # tp (SP norms, row biases, router),
        dp.all_reduce_grads(plan sum ranges, axis)     # tp_kv (a shared K/V group), etp, embd
    norm = sqrt(sum over the world of what each rank owns)   # each value once
    clip; dp.step()
"""
from __future__ import annotations

import math

import torch
import torch.distributed as dist

from . import roles, shard_plan as sp_
from .groups import Group, add_kv_groups, grad_reduce_group
from .param_attrs import tag
from .precision import make_scaler


class SingleStageRunner:
    """No pipeline: run every microbatch forward and backward through the whole model."""

    computes_loss = True

    def __init__(self, chunks: list):
        self.chunks = chunks

    def forward_backward(self, microbatches, dp, loss_scale: float = 1.0) -> float:
        model, n = self.chunks[0], len(microbatches)
        total = torch.zeros((), dtype=torch.float64, device=next(model.parameters()).device)
        for j, mb in enumerate(microbatches):
            with dp.grad_sync_context(is_last_microbatch=(j == n - 1)):
                loss = model(*mb) / n                       # mean over the global batch
                (loss * loss_scale if loss_scale != 1.0 else loss).backward()   # fp16: scaled
            total += loss.detach().double()
        return float(total)                                 # one host sync per iteration


class Engine:
    """One training iteration for any combination of strategies. See the module docstring."""

    def __init__(self, runner, dp, groups: dict[str, Group], coords: dict, cfg, plan: sp_.ShardPlan,
                 batch_transform=None):
        if not isinstance(plan, sp_.ShardPlan):   # finalize_grads, the norm and dense_shards read it
            raise TypeError(f"Engine needs the ShardPlan of what this rank holds (labkit.parallelize "
                            f"makes it), got {type(plan).__name__}")
        self.runner, self.dp, self.groups, self.coords, self.cfg = runner, dp, groups, coords, cfg
        self.plan = plan
        self.batch_transform = batch_transform or (lambda mb: mb)
        self.last_grads = None   # {name: full gradient} of the last step, when capture_grads
        self.scaler = make_scaler(cfg)             # fp16's loss scale (labkit.precision), else None
        self.skipped_iterations = 0                # Megatron's "number of skipped iterations"

    @property
    def loss_scale(self) -> float:
        return self.scaler.scale if self.scaler is not None else 1.0

    def step(self, microbatches, capture_grads: bool = False) -> tuple[float, float]:
        """One iteration on this rank's microbatches [(tokens, labels)]. Returns (loss of the whole
        global batch, global gradient norm), equal on every rank."""
        scale = self.loss_scale
        mbs = [self.batch_transform(mb) for mb in microbatches]
        loss_sum = (self.runner.forward_backward(mbs, self.dp, loss_scale=scale) if scale != 1.0
                    else self.runner.forward_backward(mbs, self.dp))
        self.finalize_grads()
        if self.scaler is not None:                # Megatron's optimizer.step: unscale, check, skip
            found_inf = self.dp.unscale_and_check(1.0 / scale)
            found_inf = _bookkeeping_sum(self.groups["world"], float(found_inf)) > 0
            self.scaler.update(found_inf)
            if found_inf:
                self.dp.skip()
                self.skipped_iterations += 1
                return self.global_loss(loss_sum), float("nan")
        if capture_grads:
            self.last_grads = self.dp.full_grads()
        grad_norm = self.grad_norm()
        clip = self.cfg.clip_grad
        if clip > 0 and grad_norm > clip:
            self.dp.scale_grads(clip / (grad_norm + 1e-6))
        self.dp.step()
        return self.global_loss(loss_sum), grad_norm

    def finalize_grads(self) -> None:
        """Megatron's order: DP first, then the sums the plan names (TP/SP, a shared K/V group,
        expert TP, the embedding group: ``shard_plan.SUM_ORDER``), in place."""
        self.dp.finish_grad_sync()
        for axis in self.plan.sum_axes():
            group = self.groups[axis]
            if group.size > 1:
                self.dp.all_reduce_grads(lambda name, a=axis: self.plan[name].sum_ranges(a), group)

    def grad_norm(self) -> float:
        """sqrt of the world's sum of the squares each rank owns (the plan: every value once)."""
        sharded = self.dp.grads_sharded
        sq = self.dp.grad_sq_sum(lambda name: self.plan[name].owned_ranges(sharded))
        return math.sqrt(_bookkeeping_sum(self.groups["world"], sq))

    def global_loss(self, loss_sum: float) -> float:
        """Loss on the last stage, shared over the world: each data-parallel replica (dp x cp, tp
        rank 0) adds its own, the sum divided by their number."""
        c = self.coords
        mine = self.runner.computes_loss and c["tp"] == 0
        replicas = self.groups["dp"].size * self.groups["cp"].size
        return _bookkeeping_sum(self.groups["world"], loss_sum if mine else 0.0) / replicas


def _bookkeeping_sum(group: Group, value) -> float:
    """Sum a logged scalar over a group; not counted in ``group.stats`` (logging, not training)."""
    if group.size == 1:
        return float(value)
    from .launcher import device
    t = torch.as_tensor(value, dtype=torch.float64).reshape(1).to(device())
    dist.all_reduce(t, group=group.pg)
    return float(t)


def dense_shards(engine: Engine, which: str = "grads") -> list:
    """This rank's part of the dense model's gradients (after a ``capture_grads`` step) or
    parameters, as the shard plan cuts them: [(ParamShard, tensor on the CPU)], only the blocks
    this rank owns (so :func:`assemble` sees each value once; ``shard_plan.ParamShard.owned_ranges``)."""
    full = engine.last_grads if which == "grads" else engine.dp.full_parameters()
    out = []
    for name, t in full.items():
        entry = engine.plan[name]
        if entry.owned_ranges(dp_sharded=False):
            out.append((entry, t.detach().cpu()))
    return out


def assemble(per_rank: list) -> dict:
    """Merge :func:`dense_shards` of every rank into {dense name: full tensor} (``shard_plan``:
    each rank's owned blocks put where the plan says they came from)."""
    asm = sp_.Assembler()
    for shards in per_rank:
        for entry, t in shards:
            asm.add(entry, t, owned_only=True)
    return asm.result()


def parallelize(model, topo, groups: dict[str, Group], cfg, seed: int = 0, zero_classes: dict | None = None
                ) -> Engine:
    """Cut the dense ``model`` for this rank, in the fixed order, and return its Engine.
    ``zero_classes``: {ZeRO stage: DP class} instead of the runtime's (labkit.data_parallel.wrap)."""
    from .data_parallel.wrap import wrap_data_parallel
    from .tensor_parallel.random import apply_rng_streams
    coords = topo.coords(dist.get_rank())
    roles.of_parameters(model)          # fails closed: every parameter's module has a role of the table
    plan = sp_.initial(model, dp_index=grad_reduce_group(groups).rank)
    # 1. Pipeline parallelism: keep this rank's stages (chapters "Pipeline", "Interleaved").
    if topo.pp > 1:
        from .pipeline_parallel.stage import split
        chunks = split(model, cfg, coords["pp"], plan)
    else:
        chunks = [model]
    # 2. Tensor (and sequence) parallelism on each stage, by role (chapters TP / SP).
    if topo.tp > 1:
        from .tensor_parallel import plan as tp_plan
        add_kv_groups(groups, topo, cfg.query_groups)
        tp_plan.apply(chunks, groups, cfg, plan)
    apply_rng_streams(chunks, seed, coords["pp"], coords["tp"], cfg.sequence_parallel and topo.tp > 1,
                      next(model.parameters()).device)
    # 3. Context parallelism: swap each layer's core attention; the Engine shards every microbatch.
    transform = None
    if topo.cp > 1:
        from .context_parallel import plan as cp_plan
        cp_plan.apply(chunks, groups, cfg, plan)
        transform = cp_plan.batch_transform(groups["cp"].rank, topo.cp)
    # 4. Expert parallelism: keep this rank's experts, tokens travel to them (chapter "Expert parallelism").
    if cfg.num_experts is not None:
        from .expert_parallel import plan as ep_plan
        coords.update(topo.expert_coords(dist.get_rank()))   # etp, edp: experts' own grid
        ep_plan.apply(chunks, groups, cfg, plan, cfg.num_microbatches(topo))
    if cfg.fp8 is not None:                                   # FP8 GEMMs, amaxes reduced per stage
        from .fp8.linear import FP8Recipe, amax_group, apply as apply_fp8
        experts = amax_group(topo, cfg.tp_only_amax_red, expert=True) if cfg.num_experts is not None else None
        apply_fp8(chunks, FP8Recipe.from_config(cfg), amax_group(topo, cfg.tp_only_amax_red), experts)
    for chunk in chunks:                                      # Megatron's tags, from the plan
        for name, p in chunk.named_parameters():
            tag(p, **plan[name].tags())
    if cfg.recompute_granularity is not None:                 # recompute the cut modules
        from .recompute import apply as apply_recompute
        apply_recompute(chunks, cfg)
    # 5. Data parallelism / ZeRO over everything this rank holds (chapter "Data parallelism").
    dp = wrap_data_parallel(chunks, groups, cfg, plan, zero_classes)
    if topo.pp > 1:
        from .pipeline_parallel.executor import PipelineRunner
        sp = topo.tp if cfg.sequence_parallel and topo.tp > 1 else 1   # SP: hidden states [b, s/t, h]
        runner = PipelineRunner(chunks, groups, schedule=cfg.schedule_name(), activation_shape=lambda tokens: (
            tokens.shape[0], tokens.shape[1] // sp, cfg.hidden_size))
    else:
        runner = SingleStageRunner(chunks)
    return Engine(runner, dp, groups, coords, cfg, plan, batch_transform=transform)


"""Apply the parallel strategies to the dense GPT in one fixed order, and run a training step.

    1. PP   split the model into this rank's stages (model chunks)          pipeline_parallel/stage.py
    2. TP   swap each chunk's modules for tensor-parallel ones, by name     tensor_parallel/plan.py
       (SP is part of the TP plan; then Megatron's dropout streams)         tensor_parallel/random.py
    3. CP   swap each chunk's core attention; shard every microbatch        context_parallel/plan.py
    4. EP   keep num_experts/ep experts of each MoE layer, swap its dispatcher expert_parallel/plan.py
    5. DP   average what the rank holds over dp (x cp); ZeRO shards it     data_parallel/wrap.py

torchtitan's order (``parallelize_llama``: pipeline split first, then TP and the rest on each
stage, data parallelism last). Each step only needs what the previous one produced, and the model
itself knows nothing of this (labkit/model.py has the seams).

One :class:`Engine` runs an iteration for every combination, finishing gradients as Megatron's
``finalize_model_grads`` does (``megatron/core/distributed/finalize_model_grads.py``, d98e8a64):

    loss = runner.forward_backward(microbatches, dp)   # PP schedule, or a plain loop
    dp.finish_grad_sync()                              # DP first: average over dp (x cp)
    dp.all_reduce_grads(sequence_parallel, tp)         # SP: norms and row biases, summed over tp
    dp.all_reduce_grads(shared_embedding, embd)        # PP: the two tied-embedding copies
    norm = sqrt(sum over the world of what each rank owns)   # param_attrs.owns: each value once
    clip; dp.step()
"""
from __future__ import annotations

import math

import torch
import torch.distributed as dist

from .groups import Group
from .param_attrs import owns


class SingleStageRunner:
    """No pipeline: run every microbatch forward and backward through the whole model."""

    computes_loss = True

    def __init__(self, chunks: list):
        self.chunks = chunks

    def forward_backward(self, microbatches, dp) -> float:
        model, n = self.chunks[0], len(microbatches)
        total = torch.zeros((), dtype=torch.float64, device=next(model.parameters()).device)
        for j, mb in enumerate(microbatches):
            with dp.grad_sync_context(is_last_microbatch=(j == n - 1)):
                loss = model(*mb) / n                       # mean over the global batch
                loss.backward()
            total += loss.detach().double()
        return float(total)                                 # one host sync per iteration


class Engine:
    """One training iteration for any combination of strategies. See the module docstring."""

    def __init__(self, runner, dp, groups: dict[str, Group], coords: dict, cfg, batch_transform=None):
        self.runner, self.dp, self.groups, self.coords, self.cfg = runner, dp, groups, coords, cfg
        self.batch_transform = batch_transform or (lambda mb: mb)
        self.last_grads = None   # {name: full gradient} of the last step, when capture_grads

    def step(self, microbatches, capture_grads: bool = False) -> tuple[float, float]:
        """One iteration on this rank's microbatches [(tokens, labels)]. Returns (loss of the whole
        global batch, global gradient norm), equal on every rank."""
        loss_sum = self.runner.forward_backward([self.batch_transform(mb) for mb in microbatches], self.dp)
        self.finalize_grads()
        if capture_grads:
            self.last_grads = self.dp.full_grads()
        grad_norm = self.grad_norm()
        clip = self.cfg.clip_grad
        if clip > 0 and grad_norm > clip:
            self.dp.scale_grads(clip / (grad_norm + 1e-6))
        self.dp.step()
        return self.global_loss(loss_sum), grad_norm

    def finalize_grads(self) -> None:
        """Megatron's order: DP first, then the TP (SP) sums, then the embedding group's sum."""
        self.dp.finish_grad_sync()
        tp, embd = self.groups.get("tp"), self.groups.get("embd")
        if tp is not None and tp.size > 1:
            self.dp.all_reduce_grads(lambda p: getattr(p, "sequence_parallel", False), tp)
        if embd is not None:
            self.dp.all_reduce_grads(lambda p: getattr(p, "shared_embedding", False), embd)

    def grad_norm(self) -> float:
        sq = self.dp.grad_sq_sum(lambda p: owns(p, self.coords, self.dp.grads_sharded))
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


def dense_shards(engine: Engine, which: str = "grads") -> dict:
    """This rank's part of the dense model's gradients (after a ``capture_grads`` step) or
    parameters: {dense name: (tensor on the CPU, partition_dim or None)}. Only the ranks that own a
    value send it (dp rank 0, cp rank 0; tp-replicated ones from tp rank 0; never the last stage's
    tied copy; an expert's from edp rank 0, and etp rank 0 unless cut over etp), so
    :func:`assemble` sees each value once."""
    full = engine.last_grads if which == "grads" else engine.dp.full_parameters()
    c = engine.coords
    params = {n: p for chunk in engine.runner.chunks for n, p in chunk.named_parameters()}
    out = {}
    for name, t in full.items():
        p = params[name]
        expert = getattr(p, "allreduce", True) is False   # its own grid: replicated over edp
        if getattr(p, "shared", False) or (c["edp"] if expert else c["dp"] or c["cp"]):
            continue
        sharded = getattr(p, "tensor_model_parallel", False)
        if sharded or c["etp" if expert else "tp"] == 0:
            out[name] = (t.detach().cpu(), getattr(p, "partition_dim", None) if sharded else None)
    return out


def assemble(per_rank: list[dict]) -> dict[str, torch.Tensor]:
    """Merge :func:`dense_shards` of every rank (in rank order, so tp shards are in tp order)
    into {dense name: full tensor}."""
    parts: dict[str, list] = {}
    for shards in per_rank:
        for name, (t, dim) in shards.items():
            parts.setdefault(name, []).append((t, dim))
    return {n: (ps[0][0] if ps[0][1] is None else torch.cat([t for t, _ in ps], dim=ps[0][1]))
            for n, ps in parts.items()}


def parallelize(model, topo, groups: dict[str, Group], cfg, seed: int = 0) -> Engine:
    """Cut the dense ``model`` for this rank, in the fixed order, and return its Engine."""
    from .data_parallel.wrap import wrap_data_parallel
    from .tensor_parallel.random import apply_rng_streams
    coords = topo.coords(dist.get_rank())
    # 1. Pipeline parallelism: keep this rank's stages (chapters "Pipeline", "Interleaved").
    if topo.pp > 1:
        from .pipeline_parallel.stage import split
        chunks = split(model, cfg, coords["pp"])
    else:
        chunks = [model]
    # 2. Tensor (and sequence) parallelism on each stage, by module name (chapters TP / SP).
    if topo.tp > 1:
        from .tensor_parallel.plan import apply_tensor_parallel
        for chunk in chunks:
            apply_tensor_parallel(chunk, groups["tp"], sequence_parallel=cfg.sequence_parallel)
    apply_rng_streams(chunks, seed, coords["pp"], coords["tp"], cfg.sequence_parallel and topo.tp > 1,
                      next(model.parameters()).device)
    # 3. Context parallelism: swap each layer's core attention; the Engine shards every microbatch.
    transform = None
    if topo.cp > 1:
        from .context_parallel.plan import apply_context_parallel
        for chunk in chunks:
            transform = apply_context_parallel(chunk, groups["cp"], cfg.cp_comm_type)
    # 4. Expert parallelism: keep this rank's experts, tokens travel to them (chapter "Expert parallelism").
    if cfg.num_experts is not None:
        from .expert_parallel.plan import apply_expert_parallel
        coords.update(topo.expert_coords(dist.get_rank()))   # etp, edp: experts' own grid
        for chunk in chunks:
            apply_expert_parallel(chunk, groups, cfg, cfg.num_microbatches(topo))
    # 5. Data parallelism / ZeRO over everything this rank holds (chapter "Data parallelism").
    dp = wrap_data_parallel(chunks, groups, cfg)
    if topo.pp > 1:
        from .pipeline_parallel.executor import PipelineRunner
        sp = topo.tp if cfg.sequence_parallel and topo.tp > 1 else 1   # SP: hidden states [b, s/t, h]
        runner = PipelineRunner(chunks, groups, activation_shape=lambda tokens: (
            tokens.shape[0], tokens.shape[1] // sp, cfg.hidden_size))
    else:
        runner = SingleStageRunner(chunks)
    return Engine(runner, dp, groups, coords, cfg, batch_transform=transform)

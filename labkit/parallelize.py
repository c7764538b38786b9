"""Apply the parallel strategies to the dense GPT, in one fixed order, and run a training step.

    TP/SP (cut layers)  ->  CP (split the sequence)  ->  PP (keep this rank's stages)  ->  DP/ZeRO

The order of picotron's train.py and torchtitan's parallelize_llama: each step only needs what the
previous one produced (TP cuts whole layers; PP then keeps some of the cut layers; DP finally wraps
whatever parameters this rank holds). The model itself knows nothing of this (labkit/model.py).

One :class:`Engine` runs an iteration for any combination:

    loss_sum = runner.forward_backward(microbatches, dp)   # PP schedule or a plain loop
    dp.finish_grad_sync()                                  # DP: average gradients over dp
    runner.finalize_model_grads()                          # SP norms over tp, tied embeddings over pp
    grad_norm = ...; dp.step()                             # optimizer (sharded under ZeRO)

Contracts of the pieces (each strategy module implements its part):
- runner: ``.module`` (what this rank holds), ``.named_parameters()``,
  ``.forward_backward(microbatches, dp) -> float`` (sum over microbatches of loss / num_microbatches,
  on the stage that computes the loss, else 0.0; backward of all but the last microbatch runs inside
  ``dp.grad_sync_context(is_last_microbatch)``), ``.computes_loss`` (bool), ``.finalize_model_grads()``.
- dp: ``grad_sync_context(is_last)``, ``finish_grad_sync()``, ``grad_sq_sum(counts)``,
  ``scale_grads(coef)``, ``step()``, ``grads_sharded`` (bool). See labkit/data_parallel.py.
"""
from __future__ import annotations

import math

import torch
import torch.distributed as dist

from .groups import Group


class SingleStageRunner:
    """No pipeline: run every microbatch forward and backward through the whole model."""

    computes_loss = True

    def __init__(self, module, groups: dict[str, Group]):
        self.module, self.groups = module, groups

    def named_parameters(self):
        return list(self.module.named_parameters())

    def forward_backward(self, microbatches, dp) -> float:
        total, n = 0.0, len(microbatches)
        for j, (tokens, labels) in enumerate(microbatches):
            with dp.grad_sync_context(is_last_microbatch=(j == n - 1)):
                loss = self.module.loss(tokens, labels) / n   # mean over the global batch
                loss.backward()
            total += loss.item()
        return total

    def finalize_model_grads(self) -> None:
        all_reduce_sequence_parallel_grads(self.module, self.groups.get("tp"))


def all_reduce_sequence_parallel_grads(module, tp: Group | None) -> None:
    """Parameters replicated over TP but fed different sequence shards (SP: layer norms, and the
    biases added after a reduce-scatter) get partial gradients: sum them over the tp group."""
    if tp is None or tp.size == 1:
        return
    from .comm import all_reduce
    for p in module.parameters():
        if getattr(p, "sequence_parallel", False) and p.grad is not None:
            p.grad.copy_(all_reduce(tp, p.grad))


def grad_reduce_group(groups: dict[str, Group]) -> Group | None:
    """The group gradients are averaged over: dp, or dp x cp when context parallel (same weights)."""
    cp = groups.get("cp")
    return groups.get("dp_cp") if cp is not None and cp.size > 1 else groups.get("dp")


def counts_once(param, groups: dict[str, Group]) -> bool:
    """Whether this rank adds ``param`` to the global gradient norm: parameters replicated over
    tp count on tp rank 0 only; a tied embedding held by first and last stage counts once."""
    tp, pp = groups.get("tp"), groups.get("pp")
    if not getattr(param, "tensor_model_parallel", False) and tp is not None and tp.rank != 0:
        return False
    if getattr(param, "shared_embedding", False) and pp is not None and pp.rank != 0:
        return False
    return True


def _bookkeeping_sum(group: Group | None, value: float, dtype=torch.float64) -> float:
    """Sum a logged scalar over a group. Not counted in ``group.stats``: logging, not training."""
    if group is None or group.size == 1:
        return value
    t = torch.tensor([value], dtype=dtype, device=_device())
    dist.all_reduce(t, group=group.pg)
    return t.item()


def _device():
    from .launcher import device
    return device()


class Engine:
    """One training iteration for any combination of strategies. See the module docstring."""

    def __init__(self, runner, dp, groups: dict[str, Group], clip_grad: float = 0.0):
        self.runner, self.dp, self.groups, self.clip_grad = runner, dp, groups, clip_grad

    def step(self, microbatches) -> tuple[float, float]:
        """Returns (loss of the whole global batch, global gradient norm), equal on every rank."""
        loss_sum = self.runner.forward_backward(microbatches, self.dp)
        self.dp.finish_grad_sync()
        self.runner.finalize_model_grads()
        grad_norm = self.grad_norm()
        if self.clip_grad > 0 and grad_norm > self.clip_grad:
            self.dp.scale_grads(self.clip_grad / (grad_norm + 1e-6))
        self.dp.step()
        return self.global_loss(loss_sum), grad_norm

    def global_loss(self, loss_sum: float) -> float:
        """Loss on the last stage, shared over pp, averaged over dp (and cp) replicas."""
        pp = self.groups.get("pp")
        local = loss_sum if self.runner.computes_loss else 0.0
        total = _bookkeeping_sum(pp, local)  # only the last stage contributes
        dp = grad_reduce_group(self.groups)
        return _bookkeeping_sum(dp, total) / (dp.size if dp is not None else 1)

    def grad_norm(self) -> float:
        sq = self.dp.grad_sq_sum(lambda p: counts_once(p, self.groups))
        if self.dp.grads_sharded:
            sq = _bookkeeping_sum(grad_reduce_group(self.groups), sq)
        sq = _bookkeeping_sum(self.groups.get("mp"), sq)
        return math.sqrt(sq)


def parallelize(model, topo, groups: dict[str, Group], cfg) -> Engine:
    """Cut the dense ``model`` for this rank, in the fixed order, and return its Engine."""
    # 1. Tensor (and sequence) parallelism: replace layers by their tp shards (chapter 4/5).
    if cfg.tensor_model_parallel_size > 1:
        from .tensor_parallel import apply_tensor_parallel
        model = apply_tensor_parallel(model, groups["tp"], sequence_parallel=cfg.sequence_parallel)
    # 2. Context parallelism: (chapter 6; not implemented yet — TrainConfig rejects cp > 1).
    # 3. Pipeline parallelism: keep this rank's stage(s) and run a schedule (chapters 7/8).
    if cfg.pipeline_model_parallel_size > 1:
        from .pipeline_parallel import PipelineRunner
        runner = PipelineRunner(model, groups, cfg)
    else:
        runner = SingleStageRunner(model, groups)
    # 4. Data parallelism / ZeRO over the parameters this rank holds (chapter 3).
    from .data_parallel import build_data_parallel
    dp = build_data_parallel(runner.named_parameters(), groups, cfg, module=runner.module)
    return Engine(runner, dp, groups, clip_grad=cfg.clip_grad)


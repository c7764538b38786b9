"""``labkit.train``: one training loop for any combination of strategies, Megatron-style logs.

    result = labkit.train(world_size=4, steps=5, micro_batch_size=2, global_batch_size=16)
    result.losses      # one float per iteration: the loss of the whole global batch

Configuration uses Megatron-LM's argument names (``labkit.config.TrainConfig``).
``global_batch_size`` defaults to ``micro_batch_size * dp``; when it is larger, each iteration
accumulates gradients over ``num_microbatches = global_batch_size / (micro_batch_size * dp)``
microbatches (under pipeline parallelism the same number is the pipeline's microbatches). The
global batch of iteration i is the same samples for every layout (labkit/data.py), so any run can be
compared with one device (``labkit.reference``). Everything is validated before a process starts: a
bad layout is a ValueError naming the rule (labkit/config.py).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from .config import TrainConfig, train_config


@dataclass
class TrainResult:
    losses: list[float]                 # loss of each iteration's global batch
    grad_norms: list[float]
    iteration_ms: list[float]           # wall time per iteration on rank 0 (varies run to run)
    config: TrainConfig
    world_size: int
    ranks: list[dict] = field(default_factory=list)  # per-rank extras (comm stats, ...), rank order
    grads: dict | None = None           # {dense name: gradient after step 1}, if capture_grads


def format_iteration(it: int, steps: int, consumed: int, ms: float, lr: float, gbs: int,
                     loss: float, grad_norm: float) -> str:
    """One line in Megatron-LM's training-log format (``training_log`` in
    ``megatron/training/training.py``; data/megatron_log_h200_dp2.txt is a real one)."""
    return (f" iteration {it:8d}/{steps:8d} | consumed samples: {consumed:12d} | "
            f"elapsed time per iteration (ms): {ms:.1f} | learning rate: {lr:.6E} | "
            f"global batch size: {gbs:5d} | lm loss: {loss:.6E} | loss scale: 1.0 | "
            f"grad norm: {grad_norm:.3f} | number of skipped iterations:   0 | "
            f"number of nan iterations:   0 |")


def train(world_size: int = 1, steps: int = 10, seed: int = 0, backend: str = "auto",
          log_interval: int = 1, timeout: float = 600.0, capture_grads: bool = False,
          **config) -> TrainResult:
    """Train the GPT on ``world_size`` ranks for ``steps`` iterations; see the module docstring.

    ``capture_grads``: also return every parameter's gradient after step 1 (averaged, before
    clipping), reassembled under the dense model's names (for parity tests and labs).
    """
    cfg = train_config(**config)
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be a positive integer, got {steps!r}")
    cfg.validate(world_size)  # fails here, before any process starts
    from .launcher import launch
    outs = launch(_worker, world_size, cfg, steps, seed, log_interval, capture_grads,
                  backend=backend, timeout=timeout)
    grads = None
    if capture_grads:
        from .parallelize import assemble
        grads = assemble([o["grads"] for o in outs])
    r0 = outs[0]
    return TrainResult(r0["losses"], r0["grad_norms"], r0["iteration_ms"], cfg, world_size,
                       [o["extra"] for o in outs], grads)


def build_rank(cfg: TrainConfig, seed: int = 0):
    """On every rank of a launch: (topology, groups, Engine) for ``cfg``, the model built, cut in
    the fixed order (labkit.parallelize) and its counters reset (training traffic only)."""
    import torch
    import torch.distributed as dist

    from .groups import build_groups
    from .launcher import device
    from .model import GPT
    from .parallelize import parallelize

    topo = cfg.validate(dist.get_world_size())
    groups = build_groups(topo)
    model = GPT(cfg.model_config(), seed=seed).to(device=device(), dtype=getattr(torch, cfg.params_dtype))
    engine = parallelize(model, topo, groups, cfg, seed)
    for g in groups.values():
        g.stats.reset()
    return topo, groups, engine


def rank_microbatches(cfg: TrainConfig, topo, iteration: int, seed: int, tokens) -> list:
    """This rank's microbatches of iteration ``iteration``'s global batch, on its device."""
    import torch.distributed as dist

    from . import data
    from .launcher import device
    inputs, labels = data.get_batch(tokens, iteration, cfg.global_batch(topo), cfg.seq_length, seed)
    dp_rank = topo.coords(dist.get_rank())["dp"]
    return [(x.to(device()), y.to(device()))
            for x, y in data.microbatches(inputs, labels, cfg.micro_batch_size, topo.dp, dp_rank)]


def _worker(cfg: TrainConfig, steps: int, seed: int, log_interval: int, capture_grads: bool) -> dict:
    """Runs on every rank: build, cut, train; rank 0 streams Megatron-format lines to the caller."""
    import torch.distributed as dist

    from . import data
    from .launcher import send_to_parent
    from .parallelize import dense_shards

    topo, groups, engine = build_rank(cfg, seed)
    rank, tokens, gbs = dist.get_rank(), data.load_tokens(), cfg.global_batch(topo)
    losses, norms, times, grads = [], [], [], {}
    for it in range(steps):
        t0 = time.perf_counter()
        mbs = rank_microbatches(cfg, topo, it, seed, tokens)
        loss, grad_norm = engine.step(mbs, capture_grads=capture_grads and it == 0)
        times.append((time.perf_counter() - t0) * 1e3)   # loss and norm are on the host: work done
        losses.append(loss)
        norms.append(grad_norm)
        if capture_grads and it == 0:
            grads = dense_shards(engine, "grads")
        if rank == 0 and log_interval and ((it + 1) % log_interval == 0 or it + 1 == steps):
            send_to_parent(format_iteration(it + 1, steps, (it + 1) * gbs, times[-1], cfg.lr, gbs,
                                            loss, grad_norm))
    extra = {"coords": topo.coords(rank),
             "comm": {axis: g.stats.snapshot() for axis, g in groups.items()},
             # bytes of params/grads/optimizer held at the last step's gradient sync (data_parallel/)
             "memory": engine.dp.memory}
    return {"losses": losses, "grad_norms": norms, "iteration_ms": times, "extra": extra,
            "grads": grads}

"""``labkit.train``: one training loop for any combination of strategies, Megatron-style logs.

    result = labkit.train(world_size=4, steps=5, micro_batch_size=2, global_batch_size=16)
    result.losses      # one float per iteration: the loss of the whole global batch

Configuration uses Megatron-LM's argument names. ``global_batch_size`` defaults to
``micro_batch_size * dp``; when it is larger, each iteration accumulates gradients over
``num_microbatches = global_batch_size / (micro_batch_size * dp)`` microbatches (seed note 000:
"under PP number of micro-batches == gradient accumulation"). The global batch of iteration i is
the same samples for every layout (labkit/data.py), so any run can be compared with one device.
Everything is validated before a process starts: a bad layout is a ValueError naming the rule.
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field

from .topology import Topology


@dataclass(frozen=True)
class TrainConfig:
    # model (labkit.model.GPTConfig; vocab comes from the byte tokenizer, padded as Megatron pads)
    num_layers: int = 2
    hidden_size: int = 64
    num_attention_heads: int = 4
    seq_length: int = 64
    ffn_hidden_size: int | None = None
    make_vocab_size_divisible_by: int = 128
    untie_embeddings_and_output_weights: bool = False
    hidden_dropout: float = 0.0
    attention_dropout: float = 0.0
    params_dtype: str = "float32"  # "float64" for exact parity tests on CPU
    # batch
    micro_batch_size: int = 2
    global_batch_size: int | None = None
    # optimizer (AdamW, constant learning rate)
    lr: float = 1e-3
    weight_decay: float = 0.01
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    adam_eps: float = 1e-8
    clip_grad: float = 0.0  # Megatron's default is 1.0; 0 turns clipping off
    # parallelism
    tensor_model_parallel_size: int = 1
    sequence_parallel: bool = False
    pipeline_model_parallel_size: int = 1
    num_layers_per_virtual_pipeline_stage: int | None = None
    context_parallel_size: int = 1
    use_distributed_optimizer: bool = False
    zero_stage: int = 0
    ddp_bucket_size: int | None = None  # None: all-reduce after backward; else bucket size (elements)

    def topology(self, world_size: int) -> Topology:
        return Topology(world_size, tp=self.tensor_model_parallel_size,
                        pp=self.pipeline_model_parallel_size, cp=self.context_parallel_size)

    def validate(self, world_size: int) -> Topology:
        """Check Megatron's rules for this world size; return the Topology. Raises ValueError."""
        if self.pipeline_model_parallel_size > 1 or self.num_layers_per_virtual_pipeline_stage:
            from .schedules import check_pipeline_config  # pure: pp vs world, layers, microbatches
            check_pipeline_config(self, world_size)
        topo = self.topology(world_size)
        for name in ("num_layers", "hidden_size", "num_attention_heads", "seq_length", "micro_batch_size"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a positive integer, got {v!r}")
        if self.params_dtype not in ("float32", "float64"):
            raise ValueError(f"params_dtype must be 'float32' or 'float64', got {self.params_dtype!r}")
        gbs, mbs, dp = self.global_batch(topo), self.micro_batch_size, topo.dp
        if gbs % (mbs * dp):
            raise ValueError(f"global_batch_size {gbs} is not divisible by micro_batch_size * dp = "
                             f"{mbs} * {dp} = {mbs * dp}")
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(f"hidden_size {self.hidden_size} is not divisible by "
                             f"num_attention_heads {self.num_attention_heads}")
        tp = self.tensor_model_parallel_size
        if self.num_attention_heads % tp:
            raise ValueError(f"num_attention_heads {self.num_attention_heads} is not divisible by "
                             f"tensor_model_parallel_size {tp}: each TP rank needs whole heads")
        if self.sequence_parallel and self.seq_length % tp:
            raise ValueError(f"seq_length {self.seq_length} is not divisible by "
                             f"tensor_model_parallel_size {tp}: sequence parallelism gives each TP "
                             f"rank s/t positions")
        if tp > 1 and (self.hidden_dropout > 0 or self.attention_dropout > 0):
            raise ValueError(f"dropout (hidden {self.hidden_dropout}, attention "
                             f"{self.attention_dropout}) with tensor_model_parallel_size {tp} needs "
                             f"per-region RNG states (Megatron's RNG tracker): use 0")
        if self.context_parallel_size > 1:
            raise ValueError("context_parallel_size > 1 is not implemented in labkit.train yet")
        if self.zero_stage not in (0, 1, 2, 3):
            raise ValueError(f"zero_stage must be 0, 1, 2 or 3, got {self.zero_stage!r}")
        if self.ddp_bucket_size is not None and (isinstance(self.ddp_bucket_size, bool) or
                                                 not isinstance(self.ddp_bucket_size, int) or
                                                 self.ddp_bucket_size <= 0):
            raise ValueError(f"ddp_bucket_size must be a positive number of elements, got {self.ddp_bucket_size!r}")
        zero = self.zero_stage or (1 if self.use_distributed_optimizer else 0)
        if zero and (tp > 1 or self.pipeline_model_parallel_size > 1):  # labkit/zero.py, chapter DP
            raise ValueError(f"zero_stage {zero} (or use_distributed_optimizer) needs tensor_model_parallel_size"
                             f" = pipeline_model_parallel_size = 1 in labkit, got tp {tp}, pp "
                             f"{self.pipeline_model_parallel_size}")
        if zero and self.ddp_bucket_size is not None:
            raise ValueError(f"ddp_bucket_size {self.ddp_bucket_size} applies to zero_stage 0 only: labkit's "
                             f"ZeRO stages communicate the whole flat buffer")
        return topo

    def global_batch(self, topo: Topology) -> int:
        return self.global_batch_size or self.micro_batch_size * topo.dp

    def num_microbatches(self, topo: Topology) -> int:
        return self.global_batch(topo) // (self.micro_batch_size * topo.dp)

    def model_config(self, tp: int | None = None):
        from .data import ByteTokenizer, padded_vocab_size
        from .model import GPTConfig
        tp = self.tensor_model_parallel_size if tp is None else tp
        return GPTConfig(num_layers=self.num_layers, hidden_size=self.hidden_size,
                         num_attention_heads=self.num_attention_heads, seq_length=self.seq_length,
                         ffn_hidden_size=self.ffn_hidden_size,
                         vocab_size=padded_vocab_size(ByteTokenizer.vocab_size,
                                                      self.make_vocab_size_divisible_by, tp),
                         hidden_dropout=self.hidden_dropout, attention_dropout=self.attention_dropout,
                         untie_embeddings_and_output_weights=self.untie_embeddings_and_output_weights)


@dataclass
class TrainResult:
    losses: list[float]                 # loss of each iteration's global batch
    grad_norms: list[float]
    iteration_ms: list[float]           # wall time per iteration on rank 0 (varies run to run)
    config: TrainConfig
    world_size: int
    ranks: list[dict] = field(default_factory=list)  # per-rank extras (comm stats, ...), rank order


def format_iteration(it: int, steps: int, consumed: int, ms: float, lr: float, gbs: int,
                     loss: float, grad_norm: float) -> str:
    """One line in Megatron-LM's training-log format (as in seed note 003's logs)."""
    return (f" iteration {it:8d}/{steps:8d} | consumed samples: {consumed:12d} | "
            f"elapsed time per iteration (ms): {ms:.1f} | learning rate: {lr:.6E} | "
            f"global batch size: {gbs:5d} | lm loss: {loss:.6E} | loss scale: 1.0 | "
            f"grad norm: {grad_norm:.3f} | number of skipped iterations:   0 | "
            f"number of nan iterations:   0 |")


def train(world_size: int = 1, steps: int = 10, seed: int = 0, backend: str = "auto",
          log_interval: int = 1, timeout: float = 600.0, **config) -> TrainResult:
    """Train the GPT on ``world_size`` ranks for ``steps`` iterations; see the module docstring."""
    unknown = set(config) - {f.name for f in dataclasses.fields(TrainConfig)}
    if unknown:
        raise ValueError(f"unknown configuration {sorted(unknown)}; see labkit.training.TrainConfig")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be a positive integer, got {steps!r}")
    cfg = TrainConfig(**config)
    cfg.validate(world_size)  # fails here, before any process starts
    from .launcher import launch
    outs = launch(_worker, world_size, cfg, steps, seed, log_interval, backend=backend, timeout=timeout)
    r0 = outs[0]
    return TrainResult(r0["losses"], r0["grad_norms"], r0["iteration_ms"], cfg, world_size,
                       [o["extra"] for o in outs])


def _worker(cfg: TrainConfig, steps: int, seed: int, log_interval: int) -> dict:
    """Runs on every rank: build, cut, train; rank 0 streams Megatron-format lines to the caller."""
    import torch
    import torch.distributed as dist

    from . import data
    from .groups import build_groups
    from .launcher import device, send_to_parent
    from .model import GPT
    from .parallelize import parallelize

    topo = cfg.validate(dist.get_world_size())
    rank = dist.get_rank()
    groups = build_groups(topo)
    dtype = getattr(torch, cfg.params_dtype)
    model = GPT(cfg.model_config(), seed=seed).to(device=device(), dtype=dtype)
    engine = parallelize(model, topo, groups, cfg)
    for g in groups.values():  # count only training traffic, not the set-up broadcast
        g.stats.reset()
    tokens = data.load_tokens()
    gbs, dp_rank = cfg.global_batch(topo), topo.coords(rank)["dp"]
    losses, norms, times = [], [], []
    for it in range(steps):
        t0 = time.perf_counter()
        inputs, labels = data.get_batch(tokens, it, gbs, cfg.seq_length, seed)
        mbs = [(x.to(device()), y.to(device()))
               for x, y in data.microbatches(inputs, labels, cfg.micro_batch_size, topo.dp, dp_rank)]
        loss, grad_norm = engine.step(mbs)
        times.append((time.perf_counter() - t0) * 1e3)
        losses.append(loss)
        norms.append(grad_norm)
        if rank == 0 and log_interval and ((it + 1) % log_interval == 0 or it + 1 == steps):
            send_to_parent(format_iteration(it + 1, steps, (it + 1) * gbs, times[-1], cfg.lr, gbs,
                                            loss, grad_norm))
    extra = {"coords": topo.coords(rank),
             "comm": {axis: g.stats.snapshot() for axis, g in groups.items()},
             # bytes of params/grads/optimizer held at the last step's gradient sync (data_parallel.py)
             "memory": getattr(engine.dp, "memory", None)}
    return {"losses": losses, "grad_norms": norms, "iteration_ms": times, "extra": extra}

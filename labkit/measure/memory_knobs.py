"""Memory knobs at runtime, measured (chapter "Memory knobs", tests/test_memory_knobs.py).

* :func:`runs` - several configurations trained on the same ranks, one after the other: losses,
  the gradients after step 1 (reassembled from the shard plans), the bytes each rank held at its
  last gradient sync, seconds per step; optionally with a trap put back (gradients accumulated in
  the 16-bit dtype instead of the fp32 main_grad; recomputation without restoring the RNGs);
* :func:`layer_saved_bytes` - what one transformer layer saves for the backward under no, selective
  and full recomputation (``labkit.measure.activations.saved_activations``);
* :func:`fsdp_timeline` - live parameter bytes at every unit boundary of one ZeRO-3 step, per-layer
  (labkit.train's) and whole-model (the data-parallelism lab's), and the per-layer order of events.
"""
from __future__ import annotations

import contextlib
import time

TRAPS = (None, "16-bit accumulation", "no RNG restore")


@contextlib.contextmanager
def planted(trap):
    """``trap`` (one of :data:`TRAPS`) patched into this process's modules for one run, and taken out
    again whatever happens: under torchrun the run is this very process, and a later run without the
    trap must not inherit it."""
    import functools

    import torch

    from .. import recompute
    from ..data_parallel import mixed
    if trap not in TRAPS:
        raise ValueError(f"trap must be one of {TRAPS}, got {trap!r}")
    saved = mixed.main_grad_dtype, recompute.apply
    try:
        if trap == "16-bit accumulation":       # main_grad in the parameters' dtype: the trap
            mixed.main_grad_dtype = lambda cfg: torch.bfloat16 if cfg.bf16 else torch.float16
        elif trap == "no RNG restore":          # what torch.utils.checkpoint alone does to labkit
            recompute.apply = functools.partial(recompute.apply, restore_rng=False)
        yield
    finally:
        mixed.main_grad_dtype, recompute.apply = saved


def _run_worker(configs: dict, steps: int, seed: int, trap) -> dict:
    with planted(trap):
        return _train_each(configs, steps, seed)


def _train_each(configs: dict, steps: int, seed: int) -> dict:
    from .. import data
    from ..config import TrainConfig
    from ..parallelize import dense_shards
    from ..training import build_rank, rank_microbatches
    tokens, out = data.load_tokens(), {}
    for name, kw in configs.items():
        cfg = TrainConfig(**kw)
        topo, groups, engine = build_rank(cfg, seed)
        losses, seconds, grads = [], [], None
        for it in range(steps):
            mbs = rank_microbatches(cfg, topo, it, seed, tokens)
            t0 = time.perf_counter()
            loss, _ = engine.step(mbs, capture_grads=it == 0)
            seconds.append(time.perf_counter() - t0)
            losses.append(loss)
            if it == 0:
                grads = dense_shards(engine, "grads")
        out[name] = {"losses": losses, "grads": grads, "memory": engine.dp.memory, "seconds": seconds,
                     "num_params": sum(p.numel() for m in engine.dp.members for p in m.params)}
    return out


def runs(world_size: int, configs: dict, steps: int = 3, seed: int = 0, trap=None, timeout: float = 300.0) -> dict:
    """{name: {"losses", "grads" {dense name: tensor}, "memory" (per rank), "seconds" (rank 0, per
    step), "num_params" (rank 0)}} for each of ``configs`` ({name: TrainConfig keyword arguments}),
    trained ``steps`` iterations on ``world_size`` ranks in one launch. ``trap``: one of :data:`TRAPS`."""
    from ..launcher import launch
    from ..parallelize import assemble
    if trap not in TRAPS:
        raise ValueError(f"trap must be one of {TRAPS}, got {trap!r}")
    outs = launch(_run_worker, world_size, configs, steps, seed, trap, timeout=timeout)
    return {name: {"losses": outs[0][name]["losses"], "grads": assemble([o[name]["grads"] for o in outs]),
                   "memory": [o[name]["memory"] for o in outs], "seconds": outs[0][name]["seconds"],
                   "num_params": outs[0][name]["num_params"]} for name in configs}


def recompute_flops_ratio(seq_length: int, micro_batch_size: int, hidden_size: int,
                          ffn_hidden_size: int | None = None) -> dict:
    """{"none" | "selective" | "full": a layer's FLOPs per training step relative to none}, analytic.

    One layer's forward is 2sb(4h^2 + 2h f) FLOPs in its linears plus 4bs^2h in the attention core
    (QK^T and AV, causal mask not exploited, as labkit's dense attention runs it); the backward costs
    twice the forward. Selective recomputation runs the core's forward again, full the whole
    forward (Korthikanti et al. 2022, Sec. 5: full costs about a third more)."""
    s, b, h = seq_length, micro_batch_size, hidden_size
    f = ffn_hidden_size or 4 * h
    core = 4 * b * s * s * h
    forward = 2 * s * b * (4 * h * h + 2 * h * f) + core
    return {"none": 1.0, "selective": (3 * forward + core) / (3 * forward), "full": 4 / 3}


def layer_saved_bytes(seq_length: int = 64, micro_batch_size: int = 2, hidden_size: int = 64,
                      num_attention_heads: int = 4, dtype: str = "float32") -> dict:
    """{"none" | "selective" | "full": bytes one TransformerLayer saves for its backward} (dropout
    off, ffn 4h), measured by saved-tensor hooks, parameters excluded."""
    import torch

    from ..model import GPTConfig, TransformerLayer
    from ..recompute import checkpoint, checkpoint_module, region_generators
    from .activations import saved_activations
    cfg = GPTConfig(num_layers=1, hidden_size=hidden_size, num_attention_heads=num_attention_heads,
                    seq_length=seq_length)
    out = {}
    for mode in ("none", "selective", "full"):
        layer = TransformerLayer(cfg).to(getattr(torch, dtype))
        x = torch.randn(micro_batch_size, seq_length, hidden_size, dtype=layer.input_layernorm.weight.dtype,
                        requires_grad=True)
        if mode == "selective":
            checkpoint_module(layer.self_attention.core_attention)
            fn = layer
        elif mode == "full":
            gens = region_generators([layer])
            fn = lambda h: checkpoint(layer, gens, h)     # noqa: E731
        else:
            fn = layer
        saved, _ = saved_activations(fn, x, exclude=list(layer.parameters()))
        out[mode] = saved.total_bytes
    return out


def _timeline_worker(cfg_kw: dict, seed: int) -> dict:
    import torch

    from .. import data
    from ..config import TrainConfig
    from ..data_parallel import zero
    from ..data_parallel.shard_layout import storage_bytes
    from ..training import build_rank, rank_microbatches
    out = {}
    for kind in ("per-layer", "whole-model"):
        cfg = TrainConfig(**cfg_kw, zero_stage=3)     # the lab's whole-model class: a parameter, no registry swap
        topo, groups, engine = build_rank(cfg, seed, {3: zero.ZeRO3WholeModel} if kind == "whole-model" else None)
        dp = engine.dp.members[-1]
        chunk = engine.runner.chunks[0]
        samples = []
        if kind == "whole-model":       # sample at the same boundaries: each layer's forward and backward
            live = lambda: storage_bytes([dp.flat, dp.shard])    # noqa: E731
            for k, layer in chunk.decoder.layers.items():
                layer.register_forward_pre_hook(lambda m, a, k=k: samples.append(("compute", int(k), live())))

                def after(m, a, o, k=k):
                    samples.append(("free", int(k), live()))
                    o.register_hook(lambda g: samples.append(("compute backward", int(k), live())))
                layer.register_forward_hook(after)
        mbs = rank_microbatches(cfg, topo, 0, seed, data.load_tokens())[:1]
        with dp.recording() if kind == "per-layer" else contextlib.nullcontext() as rec:
            engine.step(mbs)
        if kind == "per-layer":
            samples, out["events"] = list(rec.samples), list(rec.events)
            out["units"] = [(u.name, u.full_bytes, u.shard.numel() * u.shard.element_size()) for u in dp.units]
        out[kind] = samples
    return out


def fsdp_timeline(world_size: int = 2, seed: int = 0, **model) -> dict:
    """One ZeRO-3 step on ``world_size`` ranks, per-layer and whole-model: {"per-layer": [(event,
    unit, live parameter bytes)], "whole-model": [...], "events": [(event, unit)], "units": [(name,
    gathered bytes, shard bytes)]}, rank 0's."""
    from ..launcher import launch
    kw = dict(num_layers=4, hidden_size=64, num_attention_heads=4, seq_length=64, micro_batch_size=2,
              untie_embeddings_and_output_weights=True)
    kw.update(model)
    return launch(_timeline_worker, world_size, kw, seed, timeout=120.0)[0]

"""The bytes one rank sends in one step of the PyTorch-native path, predicted term by term; and
labkit's own prediction (``labkit.calc``) for the same layout. Pure Python, no torch.

The chapter's byte table puts four numbers side by side for each (axis, collective): what the
native step counted (``count.ByteCounter``), :func:`native_step_bytes`, what ``labkit.train``
counted, and ``labkit.calc``. A difference between native and labkit is one of these, each a term
below (the tests check the sum to the byte):

* FSDP2 gathers and reduces per ``fully_shard`` unit (one per layer and the root), labkit per flat
  buffer: more calls, the same bytes; FSDP2 pads each parameter's dim 0 to a multiple of dp.
* SP embedding: the plan reduce-scatters the embedding's partial sums and cuts the learned
  positions to [s/t, h] (so their gradient is all-gathered, s h / t more); labkit, like Megatron-core
  with learned positions, all-reduces, adds the positions and keeps its slice (Megatron reduce-
  scatters only without them: ``reduce_scatter_embeddings`` in
  ``megatron/core/models/common/embeddings/language_model_embedding.py``, d98e8a64).
* SP gradient sums: the row-parallel biases are added before the reduce-scatter under DTensor, so
  their gradient is complete; only the norms' gradients are summed (labkit sums both).
* loss parallel: three all-reduces of [b, s] (max, sum of exponentials, target logit); labkit
  all-gathers the t maxima and all-reduces twice: the same bytes.
* pipelining sends the tensor alone (labkit adds a 24-byte header naming it), and a V-shaped
  schedule's turn (stage p-1 to p) stays on one rank.
"""
from __future__ import annotations

import math

from ..calc.comm import all_gather_bytes, reduce_scatter_bytes, ring_all_reduce_bytes
from .options import NativeOptions, schedule_of
from .pipeline import stage_indices, stage_layers, stages_per_rank

DTYPE_BYTES = {"float32": 4, "float64": 8, "bfloat16": 2}


def _add(acc: dict, axis: str, op: str, nbytes: float) -> None:
    if nbytes:
        acc.setdefault(axis, {})
        acc[axis][op] = acc[axis].get(op, 0.0) + nbytes


def held(cfg, world_size: int, opts: NativeOptions, rank: int = 0):
    """(stage indices, number of stages, layers) that ``rank`` holds."""
    topo = cfg.topology(world_size)
    sched = schedule_of(cfg, opts)
    if sched is None:
        return [0], 1, list(range(cfg.num_layers))
    v = stages_per_rank(sched, cfg.num_layers, topo.pp, cfg.num_layers_per_virtual_pipeline_stage)
    stages = stage_indices(sched, topo.pp, topo.coords(rank)["pp"], v)
    layers = [i for s in stages for i in stage_layers(cfg.num_layers, topo.pp * v, s)]
    return stages, topo.pp * v, layers


def local_shapes(cfg, world_size: int, opts: NativeOptions, rank: int = 0) -> list[tuple[str, tuple]]:
    """(name, local shape after TP) of every parameter ``rank`` holds, in module order, for the
    model the spec describes (``labkit.spec``: LayerNorm or RMSNorm, GeLU or SwiGLU's [gate; up],
    learned positions or RoPE, group-query attention, biases or none, tied or untied output)."""
    mc, t = cfg.model_config(), cfg.tensor_model_parallel_size
    h, f, V, s = mc.hidden_size, mc.ffn_hidden_size, mc.vocab_size, mc.seq_length
    qkv = (mc.num_attention_heads + 2 * mc.query_groups) * mc.head_dim // t   # whole query groups
    fc1 = (2 if mc.swiglu else 1) * f // t                                      # [gate_r; up_r]
    stages, S, layers = held(cfg, world_size, opts, rank)

    def norm(name, n=h):
        return [(name + ".weight", (n,))] + ([(name + ".bias", (n,))] if mc.normalization == "LayerNorm" else [])

    def linear(name, shape, bias_rows):
        return [(name + ".weight", shape)] + ([(name + ".bias", (bias_rows,))] if mc.add_bias_linear else [])

    out = []
    if 0 in stages:
        out.append(("embedding.word_embeddings.weight", (V // t, h)))
        if mc.position_embedding_type == "learned_absolute":
            out.append(("embedding.position_embeddings.weight", (s, h)))
    for i in layers:
        pre = f"decoder.layers.{i}."
        qk = (norm(pre + "self_attention.q_layernorm", mc.head_dim) + norm(pre + "self_attention.k_layernorm", mc.head_dim)
              if cfg.qk_layernorm else [])                                     # per head: [d]
        out += (norm(pre + "input_layernorm") + linear(pre + "self_attention.linear_qkv", (qkv, h), qkv) + qk
                + linear(pre + "self_attention.linear_proj", (h, mc.num_attention_heads * mc.head_dim // t), h)
                + norm(pre + "pre_mlp_layernorm") + linear(pre + "mlp.linear_fc1", (fc1, h), fc1)
                + linear(pre + "mlp.linear_fc2", (h, f // t), h))
    if S - 1 in stages:
        out += norm("decoder.final_layernorm")
        if cfg.untie_embeddings_and_output_weights:
            out.append(("output_layer.weight", (V // t, h)))
    return out


def unit_elements(cfg, world_size: int, opts: NativeOptions = NativeOptions(), rank: int = 0) -> dict:
    """{FSDP2 unit: elements} of what ``rank`` holds: "layer <i>" per decoder layer, "root" for the
    rest (embedding, final norm, output layer), before padding."""
    out: dict = {}
    for name, shape in local_shapes(cfg, world_size, opts, rank):
        unit = f"layer {name.split('.')[2]}" if name.startswith("decoder.layers.") else "root"
        out[unit] = out.get(unit, 0) + math.prod(shape)
    return out


def _numel(shape, pad_to: int = 1) -> int:
    """Elements of ``shape`` with dim 0 padded to a multiple of ``pad_to`` (FSDP2's shards)."""
    return math.ceil(shape[0] / pad_to) * pad_to * math.prod(shape[1:])


def native_step_bytes(cfg, world_size: int, opts: NativeOptions = NativeOptions(), rank: int = 0) -> dict:
    """{axis: {op: bytes}} ``rank`` sends in one step (not the first of a pipeline, which also
    infers the stages' shapes) of ``labkit.train(..., implementation=opts)``."""
    topo = cfg.topology(world_size)
    t, d = topo.tp, topo.dp
    e = DTYPE_BYTES[cfg.params_dtype]
    act = 2 if opts.mixed_precision == "bf16" else e            # activations' bytes per element
    b, s, h, V = cfg.micro_batch_size, cfg.seq_length, cfg.hidden_size, cfg.model_config().vocab_size
    m = cfg.num_microbatches(topo)
    sp = cfg.sequence_parallel and t > 1
    stages, S, layers = held(cfg, world_size, opts, rank)
    first, last = 0 in stages, S - 1 in stages
    N = b * s * h * act
    out: dict = {}
    if t > 1:                                                    # per microbatch, then per step
        # per layer: out of the two row-parallel linears (fwd) and into the two column-parallel
        # ones (bwd): 4 all-reduces; under SP each becomes an all-gather and a reduce-scatter
        if sp:
            _add(out, "tp", "all_gather", m * len(layers) * 4 * all_gather_bytes(N, t))
            _add(out, "tp", "reduce_scatter", m * len(layers) * 4 * reduce_scatter_bytes(N, t))
        else:
            _add(out, "tp", "all_reduce", m * len(layers) * 4 * ring_all_reduce_bytes(N, t))
        if first:
            if sp:
                learned = cfg.position_embedding_type == "learned_absolute"    # [s, h] cut to [s/t, h]
                _add(out, "tp", "reduce_scatter", m * reduce_scatter_bytes(N, t))
                _add(out, "tp", "all_gather", m * (all_gather_bytes(N, t) + learned * all_gather_bytes(s * h * act, t)))
            else:
                _add(out, "tp", "all_reduce", m * ring_all_reduce_bytes(N, t))
        if last:
            if sp:
                _add(out, "tp", "all_gather", m * all_gather_bytes(N, t))
                _add(out, "tp", "reduce_scatter", m * reduce_scatter_bytes(N, t))
            else:
                _add(out, "tp", "all_reduce", m * ring_all_reduce_bytes(N, t))
            if opts.loss_parallel:
                _add(out, "tp", "all_reduce", m * 3 * ring_all_reduce_bytes(b * s * act, t))
            else:
                _add(out, "tp", "all_gather", m * all_gather_bytes(b * s * V * act, t))
        if sp:                                                   # norms' gradients, once per step
            per_norm = h * (2 if cfg.normalization == "LayerNorm" else 1)   # RMSNorm: no bias
            norms = 2 * per_norm * len(layers) + (per_norm if last else 0)
            _add(out, "tp", "all_reduce", ring_all_reduce_bytes(norms * e, t))
        if cfg.qk_layernorm:           # role qk_norm: each rank saw its heads, summed with or without SP
            per_head_norm = cfg.model_config().head_dim * (2 if cfg.normalization == "LayerNorm" else 1)
            _add(out, "tp", "all_reduce", ring_all_reduce_bytes(2 * per_head_norm * len(layers) * e, t))
    if topo.pp > 1:
        p = topo.pp
        sched = schedule_of(cfg, opts)
        v = S // p
        owner = {st: r for r in range(p) for st in stage_indices(sched, p, r, v)}
        msgs = sum((st < S - 1 and owner[st + 1] != owner[st]) + (st > 0 and owner[st - 1] != owner[st])
                   for st in stages)
        _add(out, "pp", "send", m * msgs * b * (s // t if sp else s) * h * act)
    if d > 1:
        _data_parallel(out, cfg, world_size, opts, rank, m, e)
    return out


def _data_parallel(out, cfg, world_size, opts, rank, m, e) -> None:
    d, zero, r = cfg.topology(world_size).dp, cfg.effective_zero_stage, opts.dp_replicate
    shapes = [shape for _, shape in local_shapes(cfg, world_size, opts, rank)]
    if zero == 0:                         # replicate: one all-reduce of the gradients per step
        _add(out, "dp", "all_reduce", ring_all_reduce_bytes(sum(_numel(x) for x in shapes) * e, d))
        return
    n = d // r                            # ranks the parameters are sharded over
    padded = sum(_numel(x, n) for x in shapes)
    shard_axis = "dp_shard" if r > 1 else "dp"
    gather_e = 2 if opts.mixed_precision == "bf16" else e
    reduce_e = 4 if opts.mixed_precision == "bf16" else e
    gathers = m * (2 if zero == 3 else 1)  # before each forward (and each backward under ZeRO-3)
    _add(out, shard_axis, "all_gather", gathers * all_gather_bytes(padded * gather_e, n))
    _add(out, shard_axis, "reduce_scatter", reduce_scatter_bytes(padded * reduce_e, n))
    if r > 1:                             # HSDP: the shards summed over the replicas
        _add(out, "dp_replicate", "all_reduce", ring_all_reduce_bytes(padded // n * reduce_e, r))


def labkit_calc_bytes(cfg, world_size: int, rank: int = 0) -> dict:
    """``labkit.calc``'s prediction of what ``labkit.train`` sends in one step for the same layout:
    ``labkit_step_bytes`` (TP, SP, PP, VPP, DP, ZeRO-1), with ZeRO-2/3 from ``dp_step_bytes``."""
    from ..calc.comm import dp_step_bytes
    from ..calc.composed import labkit_step_bytes
    e = DTYPE_BYTES[cfg.params_dtype]
    zero = cfg.effective_zero_stage
    flat = cfg if zero < 2 else _with(cfg, zero_stage=0, use_distributed_optimizer=False)
    model, par = flat.megatron_view(world_size)
    pp_rank = cfg.topology(world_size).coords(rank)["pp"]
    out = labkit_step_bytes(model, par, pp_rank, bytes_per_element=e)
    if zero >= 2:
        out.pop("dp", None)
        params = sum(_numel(x) for _, x in local_shapes(cfg, world_size, NativeOptions(), rank))
        d = cfg.topology(world_size).dp
        if d > 1:
            out["dp"] = dp_step_bytes(params * e, d, zero, num_microbatches=cfg.num_microbatches(
                cfg.topology(world_size)))
    return out


def _with(cfg, **changes):
    from dataclasses import replace
    return replace(cfg, **changes)

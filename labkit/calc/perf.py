"""A step-time model: per-stage compute, the pipeline's idle time, and the communication left exposed.

Chapter "Planning a run". One step = the slowest pipeline stage's microbatches + the pipeline's
fill and drain + communication no compute hides + the optimizer and a fixed per-step cost. Each
term, and why it is there:

- **compute** (gemm.py, kernels.py): GEMMs at a fitted fraction of peak times tile/wave
  quantization; attention at the throughput its kernel's authors published for that head dimension
  and key length; memory-bound element-wise work and FP8's casts through HBM; recomputation adds a
  forward (full) or the attention forward (selective).
- **pipeline**: 1F1B runs m microbatches through the slowest stage and fills/drains through the
  others: m t_max + (sum of the other stages) / v (Narayanan et al. 2021, Sec. 2.2; with even
  stages this is the (p-1)/(v m) bubble). Uneven splits and the last stage's logits make stages differ.
- **latency**: every collective pays NCCL's own ring latency (hardware.nccl_ring_latency: 8.4 us +
  3.4 us per NVLink step + 14 us per step across nodes), which dominates the many small ones.
- **TP**: per layer and microbatch 4 all-reduces of [s/cp, b, h] (6 with full recompute), or under
  SP an all-gather + reduce-scatter each. The backward ones hide behind the weight-gradient GEMM
  (``async_tp_backward``). Under ``tp_comm_overlap`` (Transformer Engine's userbuffers, PyTorch's
  async TP) each collective is split into tp chunks pipelined with its GEMM (Wang et al. 2023,
  ASPLOS, "Overlap communication with dependent computation via decomposition"): the first chunk
  cannot hide, the rest hide behind the GEMM unless it is shorter; PyTorch's async TP does this in
  the forward only.
- **PP**: two transfers per microbatch and chunk boundary (four with DeepSpeed's blocking sends),
  1/t of the activation with SP or 2021's scatter/gather; hidden under the interleaved schedule's
  ``overlap_p2p_comm``.
- **CP**: ring attention passes K, V (and their gradients) cp-1 hops per layer, overlapped with the
  attention blocks; only what exceeds them is exposed. **EP**: 4 all-to-alls per MoE layer, exposed.
- **DP**: gradients at ``bytes_grad`` and, with ZeRO, parameters gathered at ``bytes_param``, over
  the group's real bandwidth (``Cluster.link``: NICs shared by the node's groups).
  ``overlap_grad_reduce`` hides the reduction behind the last microbatch's backward and
  ``overlap_param_gather`` the gather behind the first forward, except the last bucket. ZeRO-3 /
  FSDP gathers each layer's parameters before its forward and again before its backward, and
  reduce-scatters its gradients after it, every microbatch; with prefetch, layer l+1's gather runs
  during layer l's compute, so a layer exposes only what its gather (and, backward, gather plus
  reduce-scatter) takes beyond its compute, plus the first layer's gather.
- **optimizer + fixed**: Adam streams ~30 bytes per local parameter shard through HBM; a fitted
  constant covers launches, data loading and logging.

The five constants (``FITTED``: GEMM efficiency of V100, A100 and H100, the fixed cost per step, how
close to its peak an FP8 GEMM gets relative to a 16-bit one) are fitted on published runs by
``runs.fit``; book/planning.ipynb judges the model by leaving each source out of the fit in turn.
"""
from __future__ import annotations

from .comm import all_gather_bytes, cp_layer_bytes, dp_step_bytes, reduce_scatter_bytes, ring_all_reduce_bytes
from .config import MIXED_18, ModelConfig, ParallelConfig, PrecisionConfig, validate, virtual_pipeline_size
from .flops import model_flops, paper_flops_per_iteration
from .gemm import FRAMEWORK_CLASS, ComputeConstants, layer_times, logits_times
from .hardware import Cluster, nccl_ring_latency
from .overlap import DDP_BUCKET_PARAMS, MEGATRON_DEFAULTS, OverlapConfig, exposed_after
from .params import embedding_params, layer_params
from .pipeline import pipeline_layer_ranges

OPTIMIZER_BYTES = 30.0   # Adam: read fp32 param, grad, m, v (16 B); write param, m, v (12) and the 16-bit copy (2)
# runs.fit(runs.load_runs()), 4 significant digits, on every run of data/published_runs.csv (each
# source weighted equally); book/planning.ipynb judges the model with each source left out instead.
FITTED = ComputeConstants(
    gemm_efficiency=(("V100", 0.5922), ("A100", 0.6741), ("H100", 0.6399)),
    fixed_seconds=0.1191, fp8_ratio=0.7767)


def collective(op: str, n_bytes: float, n: int, bandwidth: float, nodes: int = 1) -> float:
    """Seconds of one ring collective on an N-byte tensor (comm.py's byte counts) over n ranks:
    NCCL's latency plus bytes sent / bandwidth."""
    if n <= 1:
        return 0.0
    sent = {"all_reduce": ring_all_reduce_bytes, "all_gather": all_gather_bytes,
            "reduce_scatter": reduce_scatter_bytes, "all_to_all": reduce_scatter_bytes}[op](n_bytes, n)
    return nccl_ring_latency(op, n, nodes) + sent / bandwidth


def p2p(n_bytes: float, bandwidth: float, nodes: int) -> float:
    """One send/receive: NCCL's base latency and one step, plus bytes / bandwidth."""
    return nccl_ring_latency("all_gather", 2, nodes) + n_bytes / bandwidth


def stage_layer_lists(model: ModelConfig, par: ParallelConfig) -> list:
    """Layer indices of every pipeline rank (all its chunks), Megatron's split, even or uneven."""
    v = virtual_pipeline_size(model, par)
    ranges = pipeline_layer_ranges(model.num_layers, par.pp, v, par.decoder_first_pipeline_num_layers,
                                   par.decoder_last_pipeline_num_layers,
                                   par.account_for_embedding_in_pipeline_split,
                                   par.account_for_loss_in_pipeline_split)
    return [[i for a, b in chunks for i in range(a, b)] for chunks in ranges]


def hardware_flops_per_iteration(model: ModelConfig, par: ParallelConfig, convention="causal") -> float:
    """Model FLOPs plus what recomputation adds (full: one more forward of every layer;
    selective: one more forward of the attention scores, Korthikanti et al. 2022, Sec. 5)."""
    f = model_flops(model, par, convention)
    tokens = par.gbs * model.seq_length
    logits = 6 * tokens * model.hidden_size * model.padded_vocab_size(par.tp)
    q = model.kv_channels * model.num_attention_heads
    core_attn = (6 if convention == "causal" else 12) * q * model.seq_length * tokens * model.num_layers
    if par.recompute_granularity == "full":
        return f + (f - logits) / 3
    if par.recompute_granularity == "selective":
        return f + core_attn / 3
    return f


def _stage_params(model, par, layers, first, last) -> int:
    pattern = model.moe_layers()       # a layer's count depends only on whether it is MoE: once each
    per_kind = {moe: sum(layer_params(model, par.tp, par.ep, moe=moe)[k] for k in ("dense", "expert"))
                for moe in {bool(pattern[i]) for i in layers}}
    n = sum(per_kind[bool(pattern[i])] for i in layers)
    word = model.padded_vocab_size(par.tp) * model.hidden_size // par.tp
    if first:
        n += embedding_params(model, par.tp)
    if last and (model.untie_embeddings_and_output_weights or par.pp > 1):
        n += word
    return n


def _tp_layer_comm(t, coll, tp, n_fwd, sp, overlap, backward_too=True) -> float:
    """Exposed TP seconds of one layer and microbatch: ``coll`` = one collective slot (an all-reduce,
    or under SP an all-gather + reduce-scatter), n_fwd forward slots and 2 backward ones.
    ``backward_too``: Transformer Engine's userbuffers also pipeline the backward's collectives;
    PyTorch's async TP fuses the forward's all-gather + matmul and matmul + reduce-scatter only
    (its published gain: up to ~29% on the forward, ~8% end to end, Llama 3 70B; PyTorch
    dev-discuss, "Introducing Async Tensor Parallelism in PyTorch", 2024)."""
    if tp == 1:
        return 0.0
    bwd = 2 * (exposed_after(coll, t["gemm_fwd"] / 2) if overlap.async_tp_backward else coll)
    if overlap.tp_comm_overlap:            # tp chunks per slot: the first is exposed, the rest hide
        hide = (tp - 1) / tp
        fwd = n_fwd * coll / tp + exposed_after(n_fwd * coll * hide, (n_fwd / 2) * t["gemm_fwd"] * hide)
        if backward_too:
            bwd = 2 * coll / tp + exposed_after(2 * coll * hide, 2 * t["gemm_fwd"] * hide)
        return fwd + bwd
    return n_fwd * coll + bwd


def _fsdp_exposed(per_layer, gather, reduce) -> float:
    """Exposed seconds of ZeRO-3 per microbatch: layer l+1's gather runs during layer l's compute
    (forward: gather; backward: gather again + reduce-scatter); the first gather is never hidden."""
    fwd = sum(exposed_after(gather, f) for f, _ in per_layer)
    bwd = sum(exposed_after(gather + reduce, b) for _, b in per_layer)
    return gather + fwd + bwd


def step_parts(model: ModelConfig, par: ParallelConfig, cluster: Cluster,
               precision: PrecisionConfig = MIXED_18, overlap: OverlapConfig = MEGATRON_DEFAULTS,
               fp8: bool = False, framework: str = "megatron", attention: str = "flash",
               constants: ComputeConstants | None = None, sac: str | None = None) -> dict:
    """Seconds of one optimizer step and its parts (``step_time`` adds what they imply).

    ``sac``: with selective recompute, torchtitan's flavours instead of Megatron's (attention
    only): "op" (torchtitan/parallelisms/parallelize_llama.py ``_save_list``: every other matmul
    output is saved, the rest recomputed) or "layer" (``selective_ac_option`` "2": every 2nd layer
    checkpointed whole), torchtitan commit 9dec370."""
    if sac not in (None, "op", "layer"):
        raise ValueError(f"sac must be None, 'op' or 'layer', got {sac!r}")
    if sac and par.recompute_granularity != "selective":
        raise ValueError(f"sac={sac!r} needs recompute_granularity 'selective', got {par.recompute_granularity!r}")
    validate(model, par)
    if par.world_size != cluster.world_size:
        raise ValueError(f"rule: world_size equals the cluster's GPUs; {par.world_size} != "
                         f"{cluster.gpus_per_node} x {cluster.nodes}")
    if attention not in ("flash", "flash1", "triton", "math"):
        raise ValueError(f"attention must be 'flash', 'flash1', 'triton' or 'math', got {attention!r}")
    k = constants or FITTED
    gpu = cluster.gpu
    tp, pp, cp, ep, dp, v = par.tp, par.pp, par.cp, par.ep, par.dp, virtual_pipeline_size(model, par)
    mb = par.micro_batch_size
    m = par.gbs // (mb * dp)
    act = precision.bytes_activation
    rec = par.recompute_granularity
    sp = par.sequence_parallel and tp > 1
    args = (model, tp, cp, mb, gpu, k, attention, fp8)
    dense = layer_times(*args, False, ep, framework, sp)
    moe = layer_times(*args, True, ep, framework, sp) if model.num_experts else dense
    # ---- per layer and microbatch: communication on the critical path
    N = model.seq_length / cp * mb * model.hidden_size * act          # [s/cp, b, h] bytes
    bw, _ = cluster.link(tp)
    nodes_tp = cluster.group_nodes(tp)
    if sp:   # FP8 all-gathers move 1-byte activations, reduce-scatters stay 16-bit
        coll = (collective("all_gather", N / (2 if fp8 else 1), tp, bw, nodes_tp)
                + collective("reduce_scatter", N, tp, bw, nodes_tp))
    else:
        coll = collective("all_reduce", N, tp, bw, nodes_tp)
    n_fwd = 4 if rec == "full" else 2
    t_cp = 0.0
    if cp > 1:
        bw_cp, _ = cluster.link(tp * cp, cp)
        hops = 2 * (cp - 1)
        kv_hidden = model.kv_channels * model.query_groups
        t_cp = (cp_layer_bytes(model.seq_length, mb, kv_hidden, cp, act)["send_recv"] / tp / bw_cp
                + hops * p2p(0, bw_cp, cluster.group_nodes(tp * cp, cp)))
    t_ep = 0.0
    if ep > 1:
        bw_ep, _ = cluster.link(tp * cp * ep, ep)
        t_ep = 4 * collective("all_to_all", N * model.moe_router_topk, ep, bw_ep, cluster.group_nodes(tp * cp * ep, ep))

    def layer(t, is_moe):
        fwd = t["gemm_fwd"] + t["attn_fwd"] + t["elem_fwd"]
        bwd = 2 * t["gemm_fwd"] + t["attn_bwd"] + t["elem_bwd"]
        if rec == "full":
            bwd += fwd
        elif sac == "op":        # torchtitan per-op SAC: every other matmul and the cheap ops again
            bwd += t["gemm_fwd"] / 2 + t["elem_fwd"]
        elif sac == "layer":     # torchtitan layer SAC: every 2nd layer recomputed whole
            bwd += fwd / 2
        elif rec == "selective":
            bwd += t["attn_fwd"]
        comm = (_tp_layer_comm(t, coll, tp, n_fwd, sp, overlap, FRAMEWORK_CLASS.get(framework, "megatron") != "fsdp")
                + exposed_after(t_cp, t["attn_fwd"] + t["attn_bwd"]) + (t_ep if is_moe else 0.0))
        return fwd, bwd, comm

    pattern = model.moe_layers()
    lg_f, lg_b = logits_times(model, tp, cp, mb, gpu, k, fp8)
    stages = []                        # a layer's seconds depend only on whether it is MoE: once each
    per_kind = {is_moe: layer(moe if is_moe else dense, is_moe) for is_moe in {bool(x) for x in pattern}}
    for s, layers in enumerate(stage_layer_lists(model, par)):
        comp = comm = 0.0
        per_layer = []
        for i in layers:
            f, b, x = per_kind[bool(pattern[i])]
            comp, comm = comp + f + b, comm + x
            per_layer.append((f, b))
        if s == pp - 1:
            comp += lg_f + lg_b
        stages.append({"compute": comp, "comm": comm, "layers": layers, "per_layer": per_layer,
                       "params": _stage_params(model, par, layers, s == 0, s == pp - 1)})
    # ---- data parallel over DP x CP: ZeRO-3 per layer (in every microbatch), else per step
    group = dp * cp
    zero = min(par.optimizer_shard_stage, 3)
    bw_dp, _ = cluster.link(tp * group, group)
    nodes_dp = cluster.group_nodes(tp * group, group)
    if group > 1 and zero == 3:
        for st in stages:
            n_l = max(len(st["layers"]), 1)
            gather = collective("all_gather", st["params"] / n_l * precision.bytes_param, group, bw_dp, nodes_dp)
            reduce = collective("reduce_scatter", st["params"] / n_l * precision.bytes_grad, group, bw_dp, nodes_dp)
            if overlap.overlap_param_gather:
                st["fsdp"] = _fsdp_exposed(st["per_layer"], gather, reduce)
            else:
                st["fsdp"] = n_l * (2 * gather + reduce)
            st["comm"] += st["fsdp"]
    per_mb = [st["compute"] + st["comm"] for st in stages]
    worst = max(range(pp), key=per_mb.__getitem__)
    t_max = per_mb[worst]
    t_pipe = m * t_max + (sum(per_mb) - t_max) / v
    # ---- pipeline sends
    t_pp = 0.0
    if pp > 1 and not (overlap.overlap_p2p_comm and v > 1):
        bw_pp, _ = cluster.link(2 * tp * cp * dp, 2)   # neighbouring stages are tp*cp*dp ranks apart
        shard = tp if (sp or overlap.scatter_gather_p2p) else 1
        transfers = 4 if overlap.blocking_p2p else 2      # DeepSpeed: send and receive one after the other
        t_pp = transfers * m * v * p2p(N / shard, bw_pp, cluster.group_nodes(2 * tp * cp * dp, 2))
    # ---- data parallel, ZeRO 0-2: once per step for the largest stage
    big = max(stages, key=lambda st: st["params"])
    t_dp = 0.0
    if group > 1 and zero < 3:
        sent = dp_step_bytes(big["params"] * precision.bytes_param, group, zero,
                             grad_bytes=big["params"] * precision.bytes_grad, num_microbatches=m)
        full = {"all_reduce": 2 * (group - 1) / group, "reduce_scatter": (group - 1) / group,
                "all_gather": (group - 1) / group}
        t = {op: collective(op, b / full[op], group, bw_dp, nodes_dp) for op, b in sent.items()}
        reduce = t.get("all_reduce", 0.0) + t.get("reduce_scatter", 0.0)
        gather = t.get("all_gather", 0.0)
        bucket = min(1.0, DDP_BUCKET_PARAMS / max(big["params"], 1))
        fwd_mb = stages[0]["compute"] / 3
        t_dp = (exposed_after(reduce, 2 * fwd_mb, reduce * bucket) if overlap.overlap_grad_reduce else reduce)
        t_dp += exposed_after(gather, fwd_mb, gather * bucket) if overlap.overlap_param_gather else gather
    # ---- optimizer and fixed cost
    shard = big["params"] / (group if par.optimizer_shard_stage >= 1 else 1)
    t_opt = shard * OPTIMIZER_BYTES / gpu.hbm_bandwidth
    total = t_pipe + t_pp + t_dp + t_opt + k.fixed_seconds
    compute = m * stages[worst]["compute"]
    fsdp = m * stages[worst].get("fsdp", 0.0)
    return {"step_time": total, "compute": compute, "bubble": t_pipe - m * t_max,
            "tp_comm": m * stages[worst]["comm"] - fsdp, "pp_comm": t_pp, "dp_comm": t_dp + fsdp,
            "optimizer": t_opt, "fixed": k.fixed_seconds, "tokens_per_s": par.gbs * model.seq_length / total}


def step_time(model: ModelConfig, par: ParallelConfig, cluster: Cluster,
              precision: PrecisionConfig = MIXED_18, overlap: OverlapConfig = MEGATRON_DEFAULTS,
              fp8: bool = False, framework: str = "megatron", attention: str = "flash",
              constants: ComputeConstants | None = None, sac: str | None = None) -> dict:
    """Predicted time of one optimizer step, its parts, and what it implies (tokens/s, MFU, HFU).

    ``fp8``: FP8 GEMMs (Megatron ``--fp8-format``, any recipe); ``framework``: "megatron",
    "deepspeed", "torchtitan" or "composer" (gemm.FRAMEWORK_CLASS); ``attention``: "flash" or
    "math" (materialized scores).
    """
    out = step_parts(model, par, cluster, precision, overlap, fp8, framework, attention, constants, sac)
    total, n, rec, gpu = out["step_time"], par.world_size, par.recompute_granularity, cluster.gpu
    peak = gpu.peak_flops
    for conv in ("causal", "palm"):
        f, hw = model_flops(model, par, conv), hardware_flops_per_iteration(model, par, conv)
        out[f"mfu_{conv}"] = f / (total * n * peak)
        out[f"hfu_{conv}"] = hw / (total * n * peak)
    out["mfu"], out["hfu"] = out["mfu_causal"], out["hfu_causal"]
    out["model_tflops_per_gpu"] = model_flops(model, par) / (total * n) / 1e12
    out["hardware_tflops_per_gpu"] = hardware_flops_per_iteration(model, par) / (total * n) / 1e12
    out["paper_tflops_per_gpu"] = paper_flops_per_iteration(model, par.gbs, rec == "full") / (total * n) / 1e12
    return out

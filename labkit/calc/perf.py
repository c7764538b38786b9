"""A step-time model: per-stage compute, the pipeline's idle time, and the communication left exposed.

Chapter "Planning a run". One step = the slowest pipeline stage's microbatches + the pipeline's
fill and drain + communication no compute hides + the optimizer and a fixed per-step cost. Each
term, and why it is there:

- **compute** (gemm.py): GEMMs at a fitted fraction of peak times tile/wave quantization, attention
  scores (flash or materialized), memory-bound element-wise work through HBM and a per-layer cost,
  both per framework; recomputation adds a forward (full) or the attention forward (selective).
- **pipeline**: 1F1B runs m microbatches through the slowest stage and fills/drains through the
  others: m t_max + (sum of the other stages) / v (Narayanan et al. 2021, Sec. 2.2; with even
  stages this is the (p-1)/(v m) bubble). Uneven splits (pipeline.pipeline_layer_ranges) and the
  logits of the last stage make the stages differ.
- **TP**: 4 collectives of [s/cp, b, h] per layer and microbatch (6 with full recompute) on the TP
  group's link; the backward ones hide behind the weight-gradient GEMM (``async_tp_backward``),
  all of them mostly under ``tp_comm_overlap``. FP8 halves the forward all-gathers under SP.
- **PP**: two transfers per microbatch and chunk boundary (four with DeepSpeed's blocking sends,
  ``blocking_p2p``); 1/t of the activation per rank with SP or 2021's scatter/gather
  (``scatter_gather_p2p``), all of it otherwise; hidden under the interleaved schedule's
  ``overlap_p2p_comm``. Links between nodes: ``Cluster.link`` (a ring per NIC crosses a node once).
- **CP**: ring attention passes K, V (and their gradients) cp-1 hops per layer, overlapped with the
  attention blocks; only what exceeds them is exposed.
- **EP**: 4 all-to-alls per MoE layer and microbatch, exposed.
- **DP**: gradients at ``bytes_grad`` and, with ZeRO, parameters all-gathered at ``bytes_param``;
  ``overlap_grad_reduce`` hides the reduction behind the last microbatch's backward and
  ``overlap_param_gather`` the gather behind the first forward, except the last bucket.
- **optimizer + fixed**: Adam streams ~30 bytes per local parameter shard through HBM; a fitted
  constant covers launches, data loading and logging.

The constants (``FITTED``) are fitted on published runs by ``runs.fit``; book/planning.ipynb shows
the error on the sources fitted and on those held out.
"""
from __future__ import annotations

from .comm import alpha_beta_time, collective_time, cp_layer_bytes, dp_step_bytes
from .config import MIXED_18, ModelConfig, ParallelConfig, PrecisionConfig, validate, virtual_pipeline_size
from .flops import model_flops, paper_flops_per_iteration
from .gemm import ComputeConstants, layer_times, logits_times
from .hardware import Cluster
from .overlap import DDP_BUCKET_PARAMS, MEGATRON_DEFAULTS, TP_OVERLAP_EXPOSED, OverlapConfig, exposed_after
from .params import embedding_params, layer_params
from .pipeline import pipeline_layer_ranges

OPTIMIZER_BYTES = 30.0   # Adam: read fp32 param, grad, m, v (16 B); write param, m, v (12) and the 16-bit copy (2)
# runs.fit(runs.load_runs()) (Levenberg-Marquardt on log(predicted / measured), each source weighted
# equally), 4 significant digits, on the 282 runs of runs.FIT_SOURCES in data/published_runs.csv;
# the 83 runs of the other three sources are held out (book/planning.ipynb, "How good is it").
FITTED = ComputeConstants(
    gemm_efficiency=(("V100", 0.6083), ("A100", 0.6916), ("H100", 0.6892)),
    attention_efficiency=(("A100", 0.3253), ("H100", 0.2143), ("fsdp:H100", 0.1694)),
    elementwise_bytes=(("megatron", 0.0), ("deepspeed", 407.0), ("fsdp", 53.22)),
    layer_seconds=(("megatron", 0.0), ("deepspeed", 0.001566), ("fsdp", 0.004065)),
    framework_factor=(("megatron", 1.0), ("deepspeed", 0.8724), ("fsdp", 1.0)),
    fixed_seconds=0.09677, fp8_gemm_speedup=1.475)


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
    pattern, n = model.moe_layers(), 0
    for i in layers:
        c = layer_params(model, par.tp, par.ep, moe=bool(pattern[i]))
        n += c["dense"] + c["expert"]
    word = model.padded_vocab_size(par.tp) * model.hidden_size // par.tp
    if first:
        n += embedding_params(model, par.tp)
    if last and (model.untie_embeddings_and_output_weights or par.pp > 1):
        n += word
    return n


def step_parts(model: ModelConfig, par: ParallelConfig, cluster: Cluster,
               precision: PrecisionConfig = MIXED_18, overlap: OverlapConfig = MEGATRON_DEFAULTS,
               fp8: bool = False, framework: str = "megatron", attention: str = "flash",
               constants: ComputeConstants | None = None) -> dict:
    """Seconds of one optimizer step and its parts (``step_time`` adds what they imply)."""
    validate(model, par)
    if par.world_size != cluster.world_size:
        raise ValueError(f"rule: world_size equals the cluster's GPUs; {par.world_size} != "
                         f"{cluster.gpus_per_node} x {cluster.nodes}")
    if attention not in ("flash", "math"):
        raise ValueError(f"attention must be 'flash' or 'math', got {attention!r}")
    k = constants or FITTED
    gpu, n = cluster.gpu, par.world_size
    tp, pp, cp, ep, dp, v = par.tp, par.pp, par.cp, par.ep, par.dp, virtual_pipeline_size(model, par)
    mb = par.micro_batch_size
    m = par.gbs // (mb * dp)
    act = precision.bytes_activation
    rec = par.recompute_granularity
    sp = par.sequence_parallel and tp > 1
    factor = k.framework(framework)
    dense = layer_times(model, tp, cp, mb, gpu, k, attention, fp8, False, ep, framework)
    moe = layer_times(model, tp, cp, mb, gpu, k, attention, fp8, True, ep, framework) if model.num_experts else dense
    # ---- per layer and microbatch: communication on the critical path
    N = model.seq_length / cp * mb * model.hidden_size * act          # [s/cp, b, h] bytes
    bw, lat = cluster.link(tp)
    coll = collective_time("all_reduce", N, tp, bw, lat) if tp > 1 else 0.0
    fwd_scale = 0.75 if (fp8 and sp) else 1.0                          # FP8 all-gather, bf16 reduce-scatter
    n_fwd = 4 if rec == "full" else 2

    def tp_exposed(t):
        if overlap.tp_comm_overlap:
            return TP_OVERLAP_EXPOSED * (n_fwd * fwd_scale + 2) * coll
        bwd = 2 * (exposed_after(coll, t["gemm_fwd"] / 2) if overlap.async_tp_backward else coll)
        return n_fwd * fwd_scale * coll + bwd

    t_cp = 0.0
    if cp > 1:
        bw_cp, lat_cp = cluster.link(tp * cp, cp)
        kv_hidden = model.kv_channels * model.query_groups
        t_cp = alpha_beta_time(cp_layer_bytes(model.seq_length, mb, kv_hidden, cp, act)["send_recv"] / tp,
                               bw_cp, lat_cp, 2 * (cp - 1))
    t_ep = 0.0
    if ep > 1:
        bw_ep, lat_ep = cluster.link(tp * cp * ep, ep)
        t_ep = 4 * collective_time("all_to_all", N * model.moe_router_topk, ep, bw_ep, lat_ep)

    def layer(t, is_moe):
        comp = 3 * t["gemm_fwd"] + t["attn_fwd"] + t["attn_bwd"] + t["elem_fwd"] + t["elem_bwd"]
        if rec == "full":
            comp += t["gemm_fwd"] + t["attn_fwd"] + t["elem_fwd"]
        elif rec == "selective":
            comp += t["attn_fwd"]
        comm = tp_exposed(t) + exposed_after(t_cp, t["attn_fwd"] + t["attn_bwd"]) + (t_ep if is_moe else 0.0)
        return factor * comp, comm

    pattern = model.moe_layers()
    lg_f, lg_b = logits_times(model, tp, cp, mb, gpu, k, fp8)
    stages = []
    for s, layers in enumerate(stage_layer_lists(model, par)):
        comp = comm = 0.0
        for i in layers:
            c, x = layer(moe if pattern[i] else dense, bool(pattern[i]))
            comp, comm = comp + c, comm + x
        if s == pp - 1:
            comp += factor * (lg_f + lg_b)
        stages.append({"compute": comp, "comm": comm, "layers": layers,
                       "params": _stage_params(model, par, layers, s == 0, s == pp - 1)})
    per_mb = [st["compute"] + st["comm"] for st in stages]
    worst = max(range(pp), key=per_mb.__getitem__)
    t_max = per_mb[worst]
    t_pipe = m * t_max + (sum(per_mb) - t_max) / v
    # ---- pipeline sends
    t_pp = 0.0
    if pp > 1 and not (overlap.overlap_p2p_comm and v > 1):
        bw_pp, lat_pp = cluster.link(2 * tp * cp * dp, 2)   # neighbouring stages are tp*cp*dp ranks apart
        shard = tp if (sp or overlap.scatter_gather_p2p) else 1
        transfers = 4 if overlap.blocking_p2p else 2      # DeepSpeed: send and receive one after the other
        t_pp = transfers * m * v * alpha_beta_time(N / shard, bw_pp, lat_pp)
    # ---- data parallel over DP x CP, for the largest stage
    big = max(stages, key=lambda st: st["params"])
    group = dp * cp
    t_dp = 0.0
    if group > 1:
        bw_dp, lat_dp = cluster.link(tp * group, group)
        zero = min(par.optimizer_shard_stage, 3)
        sent = dp_step_bytes(big["params"] * precision.bytes_param, group, zero,
                             grad_bytes=big["params"] * precision.bytes_grad, num_microbatches=m)
        t = {op: alpha_beta_time(b, bw_dp, lat_dp, steps=(2 if op == "all_reduce" else 1) * (group - 1))
             for op, b in sent.items()}
        reduce = t.get("all_reduce", 0.0) + t.get("reduce_scatter", 0.0)
        gather = t.get("all_gather", 0.0)
        bucket = min(1.0, DDP_BUCKET_PARAMS / max(big["params"], 1))
        fwd_mb = stages[0]["compute"] / 3
        if zero == 3 and overlap.overlap_param_gather:   # FSDP: per-layer prefetch under all compute
            t_dp = exposed_after(reduce + gather, m * stages[0]["compute"], (reduce + gather) / max(len(big["layers"]), 1))
        else:
            t_dp = (exposed_after(reduce, 2 * fwd_mb, reduce * bucket) if overlap.overlap_grad_reduce else reduce)
            t_dp += exposed_after(gather, fwd_mb, gather * bucket) if overlap.overlap_param_gather else gather
    # ---- optimizer and fixed cost
    shard = big["params"] / (group if par.optimizer_shard_stage >= 1 else 1)
    t_opt = shard * OPTIMIZER_BYTES / gpu.hbm_bandwidth
    total = t_pipe + t_pp + t_dp + t_opt + k.fixed_seconds
    compute = m * stages[worst]["compute"]
    return {"step_time": total, "compute": compute, "bubble": t_pipe - m * t_max,
            "tp_comm": m * stages[worst]["comm"], "pp_comm": t_pp, "dp_comm": t_dp, "optimizer": t_opt,
            "fixed": k.fixed_seconds, "tokens_per_s": par.gbs * model.seq_length / total}


def step_time(model: ModelConfig, par: ParallelConfig, cluster: Cluster,
              precision: PrecisionConfig = MIXED_18, overlap: OverlapConfig = MEGATRON_DEFAULTS,
              fp8: bool = False, framework: str = "megatron", attention: str = "flash",
              constants: ComputeConstants | None = None) -> dict:
    """Predicted time of one optimizer step, its parts, and what it implies (tokens/s, MFU, HFU).

    ``fp8``: FP8 GEMMs (Megatron ``--fp8-format``, any recipe); ``framework``: "megatron",
    "deepspeed", "torchtitan" or "composer" (gemm.FRAMEWORK_CLASS); ``attention``: "flash" or
    "math" (materialized scores).
    """
    out = step_parts(model, par, cluster, precision, overlap, fp8, framework, attention, constants)
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

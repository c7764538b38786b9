"""A step-time model: compute at a fraction of peak + bubble + exposed communication.

Chapter "Planning a run". Assumptions, stated once:

1. Every GPU computes its share of the hardware FLOPs (model FLOPs + recomputation) at a fixed
   fraction ``efficiency`` of its peak, the same for every layout (no small-GEMM penalty).
2. The pipeline adds idle time (p-1)/(v*m) of the compute (1F1B / interleaved 1F1B).
3. Tensor-parallel collectives (4 per layer per microbatch, 6 with full recompute) and pipeline
   sends sit on the critical path (no overlap); the pipeline sends s*b*h/t per GPU (Narayanan
   et al. 2021's scatter/gather over the t NICs of a node).
4. The data-parallel gradient reduction is exposed for a fraction ``dp_exposed`` (1 = no overlap).
5. Links: alpha-beta with the cluster's bandwidths; a group that leaves the node shares the node's
   NICs with the node's other GPUs communicating at the same time.
"""
from __future__ import annotations

from .comm import collective_time, dp_step_bytes, alpha_beta_time
from .config import MIXED_18, ModelConfig, ParallelConfig, PrecisionConfig, validate, virtual_pipeline_size
from .flops import model_flops_per_iteration, paper_flops_per_iteration
from .hardware import Cluster
from .params import stage_params
from .pipeline import bubble_fraction


def hardware_flops_per_iteration(model: ModelConfig, par: ParallelConfig) -> float:
    """Model FLOPs plus what recomputation adds (full: one more forward of every layer;
    selective: one more forward of the attention scores, Korthikanti et al. 2022, Sec. 5)."""
    f = model_flops_per_iteration(model, par)
    tokens = par.gbs * model.seq_length
    logits = 6 * tokens * model.hidden_size * model.padded_vocab_size(par.tp)
    q = model.kv_channels * model.num_attention_heads
    core_attn = 6 * q * model.seq_length * tokens * model.num_layers  # QK^T and AV, causal half
    if par.recompute_granularity == "full":
        return f + (f - logits) / 3
    if par.recompute_granularity == "selective":
        return f + core_attn / 3
    return f


def step_time(model: ModelConfig, par: ParallelConfig, cluster: Cluster,
              precision: PrecisionConfig = MIXED_18, efficiency: float = 0.55, dp_exposed: float = 1.0) -> dict:
    """Predicted time of one optimizer step and what it implies (tokens/s, TFLOP/s/GPU, MFU)."""
    validate(model, par)
    if par.world_size != cluster.world_size:
        raise ValueError(f"rule: world_size equals the cluster's GPUs; {par.world_size} != "
                         f"{cluster.gpus_per_node} x {cluster.nodes}")
    if not 0 < efficiency <= 1:
        raise ValueError(f"efficiency must be in (0, 1], got {efficiency}")
    n, peak = par.world_size, cluster.gpu.peak_flops
    tp, pp, dp, v = par.tp, par.pp, par.dp, virtual_pipeline_size(model, par)
    m = par.gbs // (par.micro_batch_size * dp)
    hw = hardware_flops_per_iteration(model, par)
    t_compute = hw / (n * peak * efficiency)
    t_bubble = t_compute * bubble_fraction(pp, m, v)
    # tensor parallel: collectives of the [s/cp, b, h] activation, per layer per microbatch
    act = model.seq_length / par.cp * par.micro_batch_size * model.hidden_size * precision.bytes_activation
    bw, lat = cluster.link(tp)
    per_layer = 6 if par.recompute_granularity == "full" else 4
    t_tp = 0.0
    if tp > 1:
        t_tp = m * (model.num_layers // pp) * per_layer * collective_time("all_reduce", act, tp, bw, lat)
    # pipeline: send activations forward and gradients back, per microbatch per chunk boundary
    t_pp = 0.0
    if pp > 1:
        bw, lat = cluster.link(2 * tp * par.cp * dp)  # neighbouring stages are tp*cp*dp ranks apart
        t_pp = 2 * m * v * alpha_beta_time(act / tp, bw, lat)
    # data parallel: reduce the gradients of the largest stage (ZeRO-1 moves the same bytes;
    # ZeRO-2/3 communicate per microbatch, so gradient accumulation multiplies their cost)
    t_dp = 0.0
    if dp * par.cp > 1:
        n_params = max(sum(stage_params(model, par, s).values()) for s in range(pp))
        grads = n_params * precision.bytes_grad
        group = dp * par.cp
        bw, lat = cluster.link(tp * group)  # dp ranks are tp*cp apart (order tp-cp-ep-dp-pp)
        sent = sum(dp_step_bytes(grads, group, min(par.optimizer_shard_stage, 3),
                                 grad_bytes=grads, num_microbatches=m).values())
        t_dp = dp_exposed * alpha_beta_time(sent, bw, lat, steps=2 * (group - 1))
    total = t_compute + t_bubble + t_tp + t_pp + t_dp
    tokens = par.gbs * model.seq_length
    return {"step_time": total, "compute": t_compute, "bubble": t_bubble, "tp_comm": t_tp,
            "pp_comm": t_pp, "dp_comm": t_dp, "tokens_per_s": tokens / total,
            "model_tflops_per_gpu": model_flops_per_iteration(model, par) / (total * n) / 1e12,
            "hardware_tflops_per_gpu": hw / (total * n) / 1e12,
            "paper_tflops_per_gpu": paper_flops_per_iteration(model, par.gbs,
                                                              par.recompute_granularity == "full") / (total * n) / 1e12,
            "mfu": model_flops_per_iteration(model, par) / (total * n * peak),
            "hfu": hw / (total * n * peak)}

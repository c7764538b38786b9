"""labkit.calc: pure-Python calculators for parallel LLM training (no torch, no numpy).

Runs in the notebooks and, unchanged, in the browser (Pyodide) on the static calculator page.

    config      ModelConfig, ParallelConfig, PrecisionConfig (Megatron-LM argument names), validate
    batch       batch_math: DP size, microbatches (= gradient accumulation), tokens per step
    params      exact parameter counts per layer / per pipeline stage
    memory      zero_memory_per_rank, activation_bytes_per_layer, memory_per_stage (labkit's model)
    megatron    megatron_estimate: Megatron-LM's own memory and FLOPs numbers, exactly
    flops       model FLOPs (MFU) and the 2021 paper's count with recompute (HFU)
    comm        bytes per rank per collective and per strategy; alpha-beta times
    moe         MoE arguments (MoEArgs), the layer pattern, expert capacity (get_capacity)
    pipeline    bubble_fraction(p, m, v=1) = (p-1)/(v*m); pipeline_layer_ranges (uneven splits)
    hardware    GPUs and clusters (peak FLOP/s, memory, bandwidths)
    perf        step_time: per-stage compute, pipeline fill/drain, exposed TP/PP/CP/EP/DP comm, optimizer
    gemm        GEMM / attention / element-wise time of a layer (tile and wave quantization)
    overlap     OverlapConfig: Megatron's overlap flags and their defaults
    runs        published measured runs (data/published_runs.csv) vs the model; the fit
    planner     plan / explain / min_nodes
    presets     MODELS: Narayanan et al. 2021 table, GPT-2, GPT-3 175B, Llama-3-style, Mixtral-style
    report      the calculators' forms and HTML answers (labkit.widgets and the static page)
    cli         python -m labkit estimate (Megatron's flags) / plan
"""
from . import comm, moe
from .batch import batch_math
from .comm import (all_gather_bytes, all_to_all_bytes, alpha_beta_time, collective_time,
                   cp_attention_bytes, cp_layer_bytes, dp_step_bytes, ep_layer_bytes, pp_step_bytes,
                   reduce_scatter_bytes, ring_all_reduce_bytes, tp_layer_bytes)
from .config import (FP32, LABKIT_FP16, MEGATRON_FP16, MIXED_16, MIXED_18, PRECISIONS, ModelConfig,
                     ParallelConfig, PrecisionConfig, num_microbatches, validate)
from .flops import (attention_score_flops, mfu, model_flops, model_flops_per_iteration,
                    model_flops_per_token, paper_flops_per_iteration, utilization)
from .hardware import CLUSTERS, GPUS, Cluster, GPU, cluster
from .megatron import megatron_estimate
from .memory import (activation_bytes_per_layer, layer_activation_bytes, memory_per_stage,
                     peak_memory, zero_memory_per_rank)
from .params import active_params, layer_params, stage_params, total_params
from .overlap import MEGATRON_2021, MEGATRON_DEFAULTS, MEGATRON_TUNED, OverlapConfig
from .perf import step_time
from .pipeline import bubble_fraction, pipeline_layer_ranges
from .planner import explain, min_nodes, plan
from .presets import MODELS, model

__all__ = [
    "ModelConfig", "ParallelConfig", "PrecisionConfig", "FP32", "MIXED_16", "MIXED_18",
    "MEGATRON_FP16", "LABKIT_FP16",
    "PRECISIONS", "validate", "num_microbatches", "batch_math", "megatron_estimate",
    "zero_memory_per_rank", "activation_bytes_per_layer", "layer_activation_bytes",
    "memory_per_stage", "peak_memory", "layer_params", "stage_params", "total_params",
    "active_params", "model_flops_per_iteration", "model_flops_per_token",
    "paper_flops_per_iteration", "utilization", "mfu", "ring_all_reduce_bytes",
    "all_gather_bytes", "reduce_scatter_bytes", "all_to_all_bytes", "dp_step_bytes",
    "tp_layer_bytes", "pp_step_bytes", "cp_attention_bytes", "cp_layer_bytes", "ep_layer_bytes", "alpha_beta_time",
    "collective_time", "comm", "moe", "bubble_fraction", "pipeline_layer_ranges", "OverlapConfig",
    "MEGATRON_DEFAULTS", "MEGATRON_2021", "MEGATRON_TUNED", "model_flops", "attention_score_flops", "GPU", "Cluster", "GPUS",
    "CLUSTERS", "cluster", "step_time", "plan", "explain", "min_nodes", "MODELS", "model",
]

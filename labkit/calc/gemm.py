"""Time of one transformer layer's compute on one GPU: GEMMs, attention, memory-bound work.

Chapter "Planning a run". Each kind of work is timed by what limits it on the hardware:

1. **GEMMs** (qkv, proj, fc1, fc2, logits): FLOPs / (peak x ``gemm_efficiency`` x quantization).
   The quantization is NVIDIA's tile and wave quantization ("Matrix Multiplication Background",
   NVIDIA Deep Learning Performance guide): output tiles of 256 x 128 run in waves of one tile
   per SM, so a GEMM whose tiles do not fill the last wave, or whose dimensions are not tile
   multiples, wastes the rest: narrow models and small micro-batches run below big ones. A
   roofline bound (bytes / HBM bandwidth) covers skinny GEMMs. ``gemm_efficiency`` is fitted per
   GPU generation (runs.py). FP8 doubles the tensor-core peak (H100 datasheet: 1,979 vs 989
   TFLOP/s) but measured FP8 GEMMs gain less (scaling, casts, transposes): ``fp8_gemm_speedup``.
2. **Attention scores** (QK^T and AV). Flash kernels: causal masking skips half the blocks, the
   backward recomputes QK^T (2.5x the forward), at ``attention_efficiency`` of peak, fitted per
   generation and, where kernels differ (Triton flash attention under FSDP on H100 vs Transformer
   Engine's), per framework. The "math" path of 2021-22 code computes the full square at GEMM
   efficiency and moves the [a, s, s] scores through HBM (about 36 bytes per score over forward
   and backward: written, soft-maxed, dropped out, read, and the conjugates).
3. **Memory-bound element-wise work** (norms, bias, GeLU/SwiGLU, dropout, residuals):
   ``elementwise_bytes`` x s x b x h bytes per layer through HBM, plus ``layer_seconds`` per
   layer for kernel launches and per-layer synchronisation; both per framework, since fusion and
   the runtime differ (Megatron's fused kernels: both fit to 0; FSDP's per-layer hooks do not).

``framework_factor`` scales a framework's compute (DeepSpeed's engine ran Megatron's layers
slower). Every constant is fitted on the published runs of ``runs.FIT_SOURCES`` (runs.py).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

TILE_M, TILE_N, TILE_K = 256, 128, 64
SCORE_BYTES = 36.0
# The frameworks of the published runs, grouped by the code their layers run: Megatron-Core /
# NeMo / Transformer Engine; Megatron-DeepSpeed; PyTorch FSDP (Composer, torchtitan).
FRAMEWORK_CLASS = {"megatron": "megatron", "nemo": "megatron", "deepspeed": "deepspeed",
                   "torchtitan": "fsdp", "composer": "fsdp", "fsdp": "fsdp"}


@dataclass(frozen=True)
class ComputeConstants:
    """The fitted constants of the step-time model (their values and what they were fitted on:
    perf.FITTED and runs.fit). Tables are (key, value) pairs: GPU generation, framework class, or
    "class:generation" where one framework's kernels differ."""

    gemm_efficiency: tuple = (("V100", 0.60), ("A100", 0.70), ("H100", 0.70))
    attention_efficiency: tuple = (("A100", 0.30), ("H100", 0.20), ("fsdp:H100", 0.15))
    elementwise_bytes: tuple = (("megatron", 0.0), ("deepspeed", 400.0), ("fsdp", 50.0))
    layer_seconds: tuple = (("megatron", 0.0), ("deepspeed", 0.0), ("fsdp", 0.0))
    framework_factor: tuple = (("megatron", 1.0), ("deepspeed", 1.0), ("fsdp", 1.0))
    fixed_seconds: float = 0.1               # per iteration: optimizer launch, norms, data, logging
    fp8_gemm_speedup: float = 1.5            # FP8 GEMM time = 16-bit time / this (<= 2, the peak ratio)

    def efficiency(self, generation: str) -> float:
        return dict(self.gemm_efficiency).get(generation, dict(self.gemm_efficiency)["A100"])

    def attention(self, generation: str, framework: str = "megatron") -> float:
        table = dict(self.attention_efficiency)
        key = f"{FRAMEWORK_CLASS.get(framework, 'megatron')}:{generation}"
        return table.get(key, table.get(generation, table["A100"]))

    def elementwise(self, framework: str) -> float:
        return dict(self.elementwise_bytes)[FRAMEWORK_CLASS.get(framework, "megatron")]

    def layer_overhead(self, framework: str) -> float:
        return dict(self.layer_seconds)[FRAMEWORK_CLASS.get(framework, "megatron")]

    def framework(self, name: str) -> float:
        return dict(self.framework_factor)[FRAMEWORK_CLASS.get(name, "megatron")]


def quantization(M: float, N: float, K: float, sms: int) -> float:
    """Useful fraction of the tensor-core work of an M x N x K GEMM (tile and wave quantization)."""
    tm, tn = math.ceil(M / TILE_M), math.ceil(N / TILE_N)
    waves = math.ceil(tm * tn / sms)
    k_eff = K / (math.ceil(K / TILE_K) * TILE_K)
    return (M * N) / (waves * sms * TILE_M * TILE_N) * k_eff


def gemm_time(M, N, K, gpu, efficiency, fp8_speedup=1.0, bytes_per_element=2) -> float:
    """Seconds of one M x N x K GEMM (2MNK FLOPs) on ``gpu``: compute- or memory-bound.

    ``fp8_speedup``: FP8 GEMMs run this many times faster than 16-bit ones (1 = 16-bit)."""
    if min(M, N, K) <= 0:
        return 0.0
    compute = 2.0 * M * N * K / (gpu.peak_flops * efficiency * fp8_speedup * quantization(M, N, K, gpu.sms))
    memory = bytes_per_element * (M * K + K * N + M * N) / gpu.hbm_bandwidth
    return max(compute, memory)


def layer_times(model, tp: int, cp: int, micro_batch: int, gpu, consts: ComputeConstants,
                attention="flash", fp8=False, moe=False, ep=1, framework="megatron") -> dict:
    """Forward and backward seconds of one layer for one microbatch on one GPU, by kind of work.

    Returns {"gemm_fwd", "attn_fwd", "attn_bwd", "elem_fwd", "elem_bwd"}; the GEMM backward is
    twice the forward (input and weight gradients, same shapes).
    """
    s_full = model.seq_length
    T = s_full / cp * micro_batch                         # tokens of this GPU
    h, e = model.hidden_size, consts.efficiency(gpu.generation)
    q = model.kv_channels * model.num_attention_heads
    kv = model.kv_channels * model.query_groups
    gate = 2 if model.swiglu else 1
    sp8 = consts.fp8_gemm_speedup if (fp8 and gpu.peak_fp8_flops) else 1.0
    g = lambda n, k, m=T: gemm_time(m, n, k, gpu, e, sp8)
    gemm = g((q + 2 * kv) / tp, h) + g(h, q / tp)
    if moe:  # top-k experts per token; EP spreads experts, each GPU sees T*k tokens on average
        f = model.moe_ffn_hidden_size
        tk = T * model.moe_router_topk
        gemm += g(f * gate / tp, h, tk) + g(h, f / tp, tk) + g(model.num_experts, h)
        if model.moe_shared_expert_intermediate_size:
            fs = model.moe_shared_expert_intermediate_size
            gemm += g(fs * gate / tp, h) + g(h, fs / tp)
    else:
        f = model.ffn_hidden_size
        gemm += g(f * gate / tp, h) + g(h, f / tp)
    # attention scores: 4 s_q s_k q FLOPs forward (QK^T and AV), per TP rank q/tp
    heads_q = q / tp
    scores = 4.0 * T * s_full * heads_q
    if attention == "flash":   # causal: half the blocks; backward recomputes QK^T: 2.5x the forward
        peak = gpu.peak_flops * consts.attention(gpu.generation, framework)
        attn_fwd, attn_bwd = 0.5 * scores / peak, 1.25 * scores / peak
        score_mem = 0.0
    else:                      # materialized [a, s, s] scores: GEMMs over the full square + HBM traffic
        peak = gpu.peak_flops * e
        attn_fwd, attn_bwd = scores / peak, 2.0 * scores / peak
        score_mem = SCORE_BYTES * T * s_full * model.num_attention_heads / tp / gpu.hbm_bandwidth
    elem = consts.elementwise(framework) * T * h / gpu.hbm_bandwidth + consts.layer_overhead(framework)
    return {"gemm_fwd": gemm, "attn_fwd": attn_fwd + score_mem / 3, "attn_bwd": attn_bwd + 2 * score_mem / 3,
            "elem_fwd": elem / 3, "elem_bwd": 2 * elem / 3}


def logits_times(model, tp: int, cp: int, micro_batch: int, gpu, consts: ComputeConstants, fp8=False):
    """(forward, backward) seconds of the output layer and the cross-entropy on the last stage."""
    T = model.seq_length / cp * micro_batch
    V = model.padded_vocab_size(tp) / tp
    fwd = gemm_time(T, V, model.hidden_size, gpu, consts.efficiency(gpu.generation))
    ce = 3 * 4.0 * T * V / gpu.hbm_bandwidth   # fp32 logits: written, soft-maxed, gradient
    return fwd + ce / 3, 2 * fwd + 2 * ce / 3

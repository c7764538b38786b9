"""Time of one transformer layer's compute on one GPU: GEMMs, attention, memory-bound work.

Chapter "Planning a run". Each kind of work is timed by what limits it on the hardware:

1. **GEMMs** (qkv, proj, fc1, fc2, router, logits): FLOPs / (peak x ``gemm_efficiency`` x
   quantization). The quantization is NVIDIA's tile and wave quantization ("Matrix Multiplication
   Background", NVIDIA Deep Learning Performance guide): output tiles of 256 x 128 run in waves of
   one tile per SM, so a GEMM whose tiles do not fill the last wave, or whose dimensions are not tile
   multiples, wastes the rest. A roofline bound (bytes / HBM bandwidth) covers skinny GEMMs.
   ``gemm_efficiency`` is the one quantity fitted per GPU generation (runs.py); B200 takes H100's.
   FP8 GEMMs run ``kernels.fp8_gemm_speedup`` times faster: the datasheet peak ratio (2 on H100,
   H200, B200) times ``fp8_ratio``, how much closer to its peak an FP8 GEMM gets than a 16-bit one
   (fitted, bounded by the 0.775/0.69 pytorch/ao measured on large GEMMs), and pay
   ``kernels.fp8_cast_bytes`` of casts through HBM.
2. **Attention** (QK^T and AV): causal flash kernels at the fraction of peak their authors
   published for this head dimension, key length and GPU (``kernels.attention_efficiency``; the
   backward does 2.5x the forward's FLOPs). The "math" path of 2021-22 code computes the full square
   at GEMM efficiency and moves the [a, s, s] scores through HBM (about 36 bytes per score over
   forward and backward: written, soft-maxed, dropped out, read, and the conjugates).
3. **Memory-bound element-wise work** (norms, residual adds, GeLU/SwiGLU): the bytes
   ``kernels.elementwise_bytes`` counts for fused kernels, through HBM, for every framework (a
   per-framework factor and a per-layer cost fitted on one source did not transfer to the next).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from . import kernels

TILE_M, TILE_N, TILE_K = 256, 128, 64
SCORE_BYTES = 36.0
# The frameworks of the published runs, grouped by the code their layers run: Megatron-Core /
# NeMo / Transformer Engine; Megatron-DeepSpeed; PyTorch FSDP (Composer, torchtitan).
# FlashAttention's own GPT training (2022) fuses its layers like Megatron: its class.
FRAMEWORK_CLASS = {"megatron": "megatron", "nemo": "megatron", "deepspeed": "deepspeed",
                   "torchtitan": "fsdp", "composer": "fsdp", "fsdp": "fsdp", "flash_attn": "megatron"}


@dataclass(frozen=True)
class ComputeConstants:
    """The fitted constants of the step-time model (values and what they were fitted on: perf.FITTED
    and runs.fit): GEMM efficiency per GPU generation ((key, value) pairs; a generation no fitted run
    has takes the others' mean, B200 takes H100's), the fixed cost per step, FP8's GEMM ratio."""

    gemm_efficiency: tuple = (("V100", 0.70), ("A100", 0.70), ("H100", 0.70))
    fixed_seconds: float = 0.1               # per iteration: optimizer launch, norms, data, logging
    fp8_ratio: float = kernels.GEMM_ACHIEVABLE["fp8"] / kernels.GEMM_ACHIEVABLE["bf16"]  # FP8 / 16-bit
                                             # fraction of peak a GEMM reaches (<= torchao's, 1.123)

    def efficiency(self, generation: str) -> float:
        table = dict(self.gemm_efficiency)
        if generation in table:
            return table[generation]
        if generation == "B200" and "H100" in table:
            return table["H100"]
        return sum(table.values()) / len(table)


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
                attention="flash", fp8=False, moe=False, ep=1, framework="megatron", sp=False) -> dict:
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
    sp8 = kernels.fp8_gemm_speedup(gpu, consts.fp8_ratio) if fp8 else 1.0
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
    scores = 4.0 * T * s_full * q / tp
    cls = FRAMEWORK_CLASS.get(framework, "megatron")
    if attention in ("flash", "flash1", "triton"):   # causal: half the blocks; each CP call sees s/cp keys
        ef, eb = kernels.attention_efficiency(gpu, attention, cls, model.kv_channels, s_full / cp)
        attn_fwd, attn_bwd = 0.5 * scores / (gpu.peak_flops * ef), 1.25 * scores / (gpu.peak_flops * eb)
        score_mem = 0.0
    else:                      # materialized [a, s, s] scores: GEMMs over the full square + HBM traffic
        peak = gpu.peak_flops * e
        attn_fwd, attn_bwd = scores / peak, 2.0 * scores / peak
        score_mem = SCORE_BYTES * T * s_full * model.num_attention_heads / tp / gpu.hbm_bandwidth
    elem_bytes = kernels.elementwise_bytes(model, tp, sp)
    if fp8:
        elem_bytes += kernels.fp8_cast_bytes(model, tp, moe)
    elem = elem_bytes * T / gpu.hbm_bandwidth
    return {"gemm_fwd": gemm, "attn_fwd": attn_fwd + score_mem / 3, "attn_bwd": attn_bwd + 2 * score_mem / 3,
            "elem_fwd": elem / 3, "elem_bwd": 2 * elem / 3}


def logits_times(model, tp: int, cp: int, micro_batch: int, gpu, consts: ComputeConstants, fp8=False):
    """(forward, backward) seconds of the output layer and the cross-entropy on the last stage
    (the output layer stays in 16 bits under FP8 recipes)."""
    T = model.seq_length / cp * micro_batch
    V = model.padded_vocab_size(tp) / tp
    fwd = gemm_time(T, V, model.hidden_size, gpu, consts.efficiency(gpu.generation))
    ce = 3 * 4.0 * T * V / gpu.hbm_bandwidth   # fp32 logits: written, soft-maxed, gradient
    return fwd + ce / 3, 2 * fwd + 2 * ce / 3

"""What the kernels of a layer achieve, from their authors' published measurements (chapter "Planning a run").

Nothing here is fitted on training runs; each number is read in the source named beside it.

**Attention** (``attention_efficiency``). Flash-attention kernels run further from peak at short
sequences: each block of queries pays a fixed cost (loading Q, the causal diagonal block, the
rescale and the write of O) that a longer key loop amortizes. The published throughputs fit
``1/E(s) = 1/E_inf + (s_0/E_inf)/s`` (time = FLOPs/E_inf + a cost linear in s), which is
``E(s) = E_inf * s / (s + s_0)``; ``E_inf`` and ``s_0`` are solved here by least squares on each
published curve (causal mask, per head dimension, per GPU and kernel):

- FlashAttention-2 and -1, forward + backward, A100 80GB SXM4 and H100 80GB SXM5 (Dao 2023,
  arXiv 2307.08691, Fig. 4 and 6; the same bars in Dao-AILab/flash-attention
  ``assets/flash2_{a100,h100}_fwd_bwd_benchmark.png``, commit 0251105a). Batch x sequence = 16K
  tokens, hidden 2048; FLOPs counted as the benchmark does: 4 s^2 d heads / 2 forward (causal),
  x 3.5 forward + backward.
- cuDNN and FlashAttention-2 **forward** on H100 (Shah et al. 2024, FlashAttention-3, arXiv
  2407.08608, Fig. 5; ``assets/flash3_fp16_fwd.png``). Transformer Engine (Megatron-Core, NeMo)
  runs cuDNN's fused attention on Hopper. Its backward curve is not published there: labkit
  assumes cuDNN's backward keeps FlashAttention-2's backward/forward ratio at each length (FA-2's
  backward follows from its forward + backward and forward curves).

The Triton FlashAttention kernel (``flash_attn.flash_attn_triton``, "FlashAttention Triton" in the
same figure; llm-foundry's ``attn_impl: triton``) is published on A100 only; on H100 labkit assumes it
gains what FlashAttention-2 gains from A100 to H100 at each length (neither uses Hopper's wgmma).

Which kernel a run uses: ``flash1`` = FlashAttention-1 (2022 code); ``triton``; ``flash`` = the framework's
default for the GPU: cuDNN via Transformer Engine for Megatron-class frameworks on Hopper and later,
FlashAttention-2 otherwise (PyTorch SDPA's flash backend is FlashAttention-2). H200 and the 500 W
H100 take H100's fraction of peak; B200 has no published curve in these sources and is assumed to
reach cuDNN-on-H100's fraction of its own peak.

**FP8 GEMMs** (``fp8_gemm_speedup``): dense FP8 tensor-core peak is twice BF16's on H100, H200 and
B200 (NVIDIA datasheets: 1,979 vs 989 TFLOP/s; B200 4.5 vs 2.25 PFLOP/s); large FP8 GEMMs reach
77.5% of it against 69% for BF16 (pytorch/ao ``torchao/testing/training/roofline_utils.py``,
"pct_achievable_gemm_tops", measured on H100; torchao copies the H100 values to B200). That ratio
(1.12) is an upper bound: the published training runs put the GEMMs of training shapes lower, and
``perf.FITTED.fp8_ratio`` is fitted on them (the one FP8 constant). What FP8 does
not speed up is counted in ``fp8_cast_bytes``: each linear layer's input and output gradient are
cast to FP8 with a transposed copy for the backward (Transformer Engine's cast-transpose: read 2
bytes, write 1 + 1), memory-bound work through HBM; attention, norms and the other element-wise work
stay in 16 bits.

**Element-wise work** (``elementwise_bytes``): bytes per token through HBM, forward + backward, of
a pre-norm layer's norms, residual adds, activation function and rotary embedding, counted as
fused kernels move them (each tensor read and written once per kernel, 2-byte activations).
"""
from __future__ import annotations

import math

SEQS = (512, 1024, 2048, 4096, 8192, 16384)
# (kernel, GPU, pass, head dim): TFLOP/s at SEQS, causal mask (the figures named in the docstring)
PUBLISHED = {
    ("fa2", "A100", "fwd_bwd", 64): (88, 119, 140, 156, 165, 171),
    ("fa2", "A100", "fwd_bwd", 128): (99, 133, 155, 173, 182, 189),
    ("fa1", "A100", "fwd_bwd", 64): (58, 70, 77, 87, 92, 97),
    ("fa1", "A100", "fwd_bwd", 128): (55, 62, 69, 76, 80, 83),
    ("triton", "A100", "fwd_bwd", 64): (59, 75, 79, 76, 79, 80),
    ("triton", "A100", "fwd_bwd", 128): (50, 61, 68, 74, 78, 80),
    ("fa2", "H100", "fwd_bwd", 64): (141, 192, 232, 257, 273, 284),
    ("fa2", "H100", "fwd_bwd", 128): (163, 221, 265, 294, 308, 328),
    ("fa1", "H100", "fwd_bwd", 64): (104, 123, 136, 138, 149, 156),
    ("fa1", "H100", "fwd_bwd", 128): (98, 109, 108, 126, 135, 137),
    ("fa2", "H100", "fwd", 64): (180, 229, 262, 284, 295, 299),
    ("fa2", "H100", "fwd", 128): (191, 260, 298, 319, 333, 335),
    ("cudnn", "H100", "fwd", 64): (225, 288, 334, 363, 379, 388),
    ("cudnn", "H100", "fwd", 128): (315, 410, 484, 518, 529, 539),
    ("cudnn", "H100", "fwd", 256): (308, 391, 450, 483, 497, 509),
}
BENCH_PEAK = {"A100": 312e12, "H100": 989e12}   # the benchmarked GPUs' dense 16-bit peaks
BWD_SHARE = 2.5 / 3.5                           # the benchmark's backward FLOPs: 2.5x the forward

# FP8: achievable fraction of peak for large GEMMs (torchao roofline_utils, H100)
GEMM_ACHIEVABLE = {"bf16": 0.69, "fp8": 0.775}
CAST_BYTES = 4.0   # per element cast to FP8: read 2 B, write 1 B FP8 + 1 B transposed FP8


def fit_curve(seqs, tflops) -> tuple:
    """(E_inf, s_0) of E(s) = E_inf s / (s + s_0): least squares of 1/E on 1/s."""
    x = [1.0 / s for s in seqs]
    y = [1.0 / e for e in tflops]
    n, mx, my = len(x), sum(x) / len(x), sum(y) / len(y)
    b = sum((xi - mx) * (yi - my) for xi, yi in zip(x, y)) / sum((xi - mx) ** 2 for xi in x)
    a = my - b * mx
    return 1.0 / a, b / a


CURVES = {k: fit_curve(SEQS, v) for k, v in PUBLISHED.items()}


def _curve_at(kernel, gpu, kind, head_dim, s) -> float:
    """TFLOP/s of a published curve at key length s, interpolated in log2(head dim) (clamped)."""
    dims = sorted(d for (k, g, p, d) in CURVES if (k, g, p) == (kernel, gpu, kind))
    if not dims:
        raise ValueError(f"no published {kind} curve for kernel {kernel!r} on {gpu}")
    d = min(max(head_dim, dims[0]), dims[-1])
    lo = max(x for x in dims if x <= d)
    hi = min(x for x in dims if x >= d)
    at = lambda dd: CURVES[(kernel, gpu, kind, dd)][0] * s / (s + CURVES[(kernel, gpu, kind, dd)][1])
    if lo == hi:
        return at(lo)
    w = (math.log2(d) - math.log2(lo)) / (math.log2(hi) - math.log2(lo))
    return 1.0 / ((1 - w) / at(lo) + w / at(hi))


def attention_tflops(kernel, gpu, head_dim, s) -> tuple:
    """(forward, backward) TFLOP/s of a causal attention kernel at key length ``s``."""
    if kernel in ("fa2", "fa1"):
        fb = _curve_at(kernel, gpu, "fwd_bwd", head_dim, s)
        if (kernel, gpu, "fwd", 64) in CURVES:
            f = _curve_at(kernel, gpu, "fwd", head_dim, s)
            return f, BWD_SHARE * 3.5 / (3.5 / fb - 1.0 / f)
        return fb, fb                       # only forward + backward published: one rate for both
    if kernel == "triton":
        t = _curve_at("triton", "A100", "fwd_bwd", head_dim, s)
        if gpu != "A100":
            t *= _curve_at("fa2", gpu, "fwd_bwd", head_dim, s) / _curve_at("fa2", "A100", "fwd_bwd", head_dim, s)
        return t, t
    if kernel == "cudnn":
        f = _curve_at("cudnn", gpu, "fwd", head_dim, s)
        f2, b2 = attention_tflops("fa2", gpu, head_dim, s)
        return f, f * b2 / f2               # FA-2's backward/forward ratio at this length
    raise ValueError(f"kernel must be 'fa1', 'fa2' or 'cudnn', got {kernel!r}")


def attention_kernel(attention: str, framework_class: str, generation: str) -> str:
    """The kernel a run's attention uses (see the module docstring)."""
    if attention in ("flash1", "triton"):
        return {"flash1": "fa1", "triton": "triton"}[attention]
    if attention != "flash":
        raise ValueError(f"attention must be 'flash', 'flash1', 'triton' or 'math', got {attention!r}")
    if framework_class == "megatron" and generation in ("H100", "B200"):
        return "cudnn"
    return "fa2"


def attention_efficiency(gpu, attention: str, framework_class: str, head_dim: int, s: float) -> tuple:
    """(forward, backward) fraction of ``gpu``'s dense 16-bit peak reached by causal attention
    over keys of length ``s``: the published curve's TFLOP/s over the benchmarked GPU's peak."""
    gen = gpu.generation
    bench = {"V100": "A100", "A100": "A100", "H100": "H100", "B200": "H100"}.get(gen)
    if bench is None:
        raise ValueError(f"no attention curve for GPU generation {gen!r}")
    kernel = attention_kernel(attention, framework_class, gen)
    f, b = attention_tflops(kernel, bench, head_dim, s)
    return f * 1e12 / BENCH_PEAK[bench], b * 1e12 / BENCH_PEAK[bench]


def fp8_gemm_speedup(gpu, ratio: float | None = None) -> float:
    """FP8 over 16-bit GEMM throughput: the datasheet peak ratio times ``ratio``, the FP8 GEMM's
    achievable fraction of its peak over the 16-bit GEMM's (default: pytorch/ao's 0.775 / 0.69 for
    large GEMMs, an upper bound for the shapes of training; perf.FITTED holds the fitted value)."""
    if not gpu.peak_fp8_flops:
        return 1.0
    r = GEMM_ACHIEVABLE["fp8"] / GEMM_ACHIEVABLE["bf16"] if ratio is None else ratio
    return gpu.peak_fp8_flops / gpu.peak_flops * r


def linear_widths(model, tp: int, moe: bool = False) -> tuple:
    """(inputs, outputs): elements per token entering and leaving the layer's linear layers on one
    TP rank (qkv, proj, fc1, fc2; a MoE layer's expert MLP per routed copy x top-k)."""
    h, q = model.hidden_size, model.kv_channels * model.num_attention_heads
    kv = model.kv_channels * model.query_groups
    gate = 2 if model.swiglu else 1
    f, k = (model.moe_ffn_hidden_size, model.moe_router_topk) if moe else (model.ffn_hidden_size, 1)
    ins = h + q / tp + k * (h + f / tp)
    outs = (q + 2 * kv) / tp + h + k * (f * gate / tp + h)
    return ins, outs


def fp8_cast_bytes(model, tp: int, moe: bool = False) -> float:
    """Bytes per token per layer, forward + backward, FP8 adds through HBM: cast-transpose of each
    linear's input (forward) and of its output gradient (backward)."""
    ins, outs = linear_widths(model, tp, moe)
    return CAST_BYTES * (ins + outs)


def elementwise_bytes(model, tp: int, sp: bool) -> float:
    """Bytes per token per layer, forward + backward, of the memory-bound work around the GEMMs.

    Forward: two norms (read x, write y: 4h each), two residual adds (read 2, write 1: 6h each),
    the activation (GeLU reads and writes f: 4f; SwiGLU reads 2f, writes f: 6f), rotary embedding on
    q and k (4(q + kv)). Backward about twice each (read the gradient and the saved input, write the
    gradient): norms 6h, adds 4h, GeLU 6f, SwiGLU 10f, rotary 4(q + kv). Tensors of width h are
    split over TP only under SP; f, q and kv always are."""
    h, q = model.hidden_size, model.kv_channels * model.num_attention_heads
    kv = model.kv_channels * model.query_groups
    f = (model.moe_ffn_hidden_size * model.moe_router_topk if model.num_experts else model.ffn_hidden_size)
    hs = h / tp if sp else h
    rope = 8 * (q + kv) / tp if model.position_embedding_type == "rope" else 0.0
    act = (16 if model.swiglu else 10) * f / tp
    return 2 * (4 + 6) * hs + 2 * (6 + 4) * hs + act + rope


def fp8_gather_bytes(fp8_elements, other_bytes) -> float:
    """``comm.dp_step_bytes``'s ``gather_bytes`` under ``--fp8-param-gather``: the FP8 linears'
    weights at 1 B per element (their per-tensor scale is computed on every rank from an all-reduced
    amax, not gathered), the other parameters in their own ``other_bytes``."""
    return float(fp8_elements) + float(other_bytes)

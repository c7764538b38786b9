"""An FP8 GEMM, emulated on the CPU: out = A @ B^T from two quantized operands.

How an FP8 tensor core computes it (DeepSeek-V3, arXiv:2412.19437, section 3.3.2): the products
of FP8 elements are exact; they are summed along K inside the tensor core with a LIMITED-precision
accumulator (about 14 significant bits on H800), and every ``promote_every`` = 128 elements (one
scale block) the partial sum is multiplied by the two blocks' dequantization scales and added to
an fp32 accumulator on the CUDA cores ("promotion"). ``gemm`` follows that structure exactly:

    for each K-chunk c (inside one scale block of A and of B):
        partial_c = sum_k qa[:, k] * qb[:, k]           fp32, or rounded to accum_bits after each add
        out      += partial_c * sa_c[:, None] * sb_c[None, :]       fp32

``accum_bits=None`` sums each chunk with an fp32 matmul. ``promote_every=None`` uses the finest
scale block along K (the whole K for per-tensor scales).
"""
from __future__ import annotations

import torch

from .scaling import Quantized


def truncate_mantissa(x: torch.Tensor, bits: int) -> torch.Tensor:
    """fp32 x with only ``bits`` significant bits kept (the rest dropped, rounding toward zero),
    as an accumulator that aligns by right-shifting keeps them."""
    drop = 24 - bits
    mask = ~((1 << drop) - 1) & 0xFFFFFFFF
    mask = mask - (1 << 32) if mask >= 1 << 31 else mask
    return (x.contiguous().view(torch.int32) & mask).view(torch.float32)


def _col_scale(q: Quantized, start: int) -> torch.Tensor:
    """The dequantization scale of each row of q at column ``start``: [rows] fp32."""
    bm, bk = q.block
    s = q.scale_inv.float()[:, start // bk]
    return s.repeat_interleave(bm)[: q.data.shape[0]]


def _chunk(q: Quantized, promote_every: int | None) -> int:
    k = q.data.shape[1]
    return min(q.block[1], k) if promote_every is None else promote_every


def gemm(a: Quantized, b: Quantized, promote_every: int | None = None,
         accum_bits: int | None = None) -> torch.Tensor:
    """a [M, K] @ b [N, K]^T -> [M, N] fp32, blockwise-exact emulation of an FP8 tensor core."""
    m, k = a.data.shape
    c = min(_chunk(a, promote_every), _chunk(b, promote_every))
    for q in (a, b):
        if q.block[1] < k and q.block[1] % c:
            raise ValueError(f"a K-chunk of {c} would straddle {q.block} scale blocks")
    qa, qb = a.data.float(), b.data.float()
    out = torch.zeros(m, b.data.shape[0])
    for start in range(0, k, c):
        stop = min(start + c, k)
        if accum_bits is None:
            partial = qa[:, start:stop] @ qb[:, start:stop].T
        else:
            partial = torch.zeros_like(out)
            for i in range(start, stop):     # one add at a time, each rounded like the accumulator
                partial = truncate_mantissa(partial + qa[:, i, None] * qb[None, :, i], accum_bits)
        out += partial * _col_scale(a, start)[:, None] * _col_scale(b, start)[None, :]
    return out


def dequantize_gemm(a: Quantized, b: Quantized) -> torch.Tensor:
    """a [M, K] @ b [N, K]^T -> [M, N]: dequantize both to fp32, then one fp32 matmul (what
    ``torch._scaled_mm`` does on the CPU: equal to it element for element, tests/test_fp8.py)."""
    return a.dequantize() @ b.dequantize().T


def accumulation_error(a: Quantized, b: Quantized, promote_every: int, accum_bits: int = 14) -> float:
    """max |gemm with a limited accumulator - exact| / max |exact| (exact: float64 of the
    dequantized operands): DeepSeek-V3's measure of the accumulator's precision loss."""
    exact = a.dequantize().double() @ b.dequantize().double().T
    got = gemm(a, b, promote_every=promote_every, accum_bits=accum_bits)
    return ((got.double() - exact).abs().max() / exact.abs().max()).item()

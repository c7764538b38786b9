"""The four FP8 scaling recipes, with Megatron-LM's names (``--fp8-recipe``).

    recipe       granularity                              scale                     source
    tensorwise   one scale per tensor, from its own amax  fp32, max/amax            TE Float8CurrentScaling
    delayed      one per tensor, from an amax HISTORY     fp32, max/amax / 2^margin TE DelayedScaling
    blockwise    1x128 tiles (activations, gradients),    fp32, a power of two      DeepSeek-V3 (arXiv:2412.19437),
                 128x128 blocks (weights)                                           TE Float8BlockScaling
    mxfp8        1x32 blocks along the reduction dim      E8M0 (power of two)       OCP MX spec v1.0, TE MXFP8BlockScaling

A quantized tensor keeps its FP8 ``data`` and the DEQUANTIZATION factor ``scale_inv`` per block:
x ~= data * scale_inv. Quantizing multiplies by ``scale = 1 / scale_inv`` in fp32 and casts
(``formats.cast``: saturating, round to nearest even), as Transformer Engine does.

Transformer Engine's rules, followed literally (``compute_scale_from_amax`` in
transformer_engine/common/recipe/recipe_common.cuh; ``_default_sf_compute`` in
transformer_engine/pytorch/fp8.py):
    current scaling   amax 0 or inf -> scale 1; scale = max/amax; scale inf -> FLT_MAX; NaN -> NaN;
                      pow2: the scale's mantissa dropped (rounded down to a power of two)
    delayed scaling   scale = (max / amax) / 2^margin, amax from the history (max or most_recent);
                      amax 0 or not finite -> the previous scale is kept
MX (OCP MX v1.0 section 6.3): shared exponent floor(log2 amax) - emax_elem, element = cast(x / 2^e).
"""
from __future__ import annotations

import math

from dataclasses import dataclass, field

import torch

from .formats import E8M0, Format, cast, e8m0_exponent

FLT_MAX = torch.finfo(torch.float32).max


@dataclass
class Quantized:
    """An FP8 tensor: ``data`` [M, K] (fp8 dtype), ``scale_inv`` [M/bm, K/bn] (fp32, or E8M0 for
    mxfp8), ``block`` (bm, bn): which block of ``data`` each scale covers (ragged edges allowed)."""
    data: torch.Tensor
    scale_inv: torch.Tensor
    block: tuple[int, int]
    fmt: Format

    def expanded_scale_inv(self) -> torch.Tensor:
        """scale_inv repeated to data's shape (fp32)."""
        bm, bn = self.block
        s = self.scale_inv.float().repeat_interleave(bm, 0).repeat_interleave(bn, 1)
        return s[: self.data.shape[0], : self.data.shape[1]]

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """data * scale_inv in ``dtype`` (fp32: what torch._scaled_mm computes on the CPU)."""
        return self.data.to(dtype) * self.expanded_scale_inv().to(dtype)

    @property
    def nbytes(self) -> int:
        """Bytes held: one per element plus the scales (4 each; 1 for E8M0)."""
        return self.data.numel() + self.scale_inv.numel() * self.scale_inv.element_size()


def current_scale(amax: torch.Tensor, fmt: Format, pow2: bool = False) -> torch.Tensor:
    """Transformer Engine's ``compute_scale_from_amax`` (epsilon 0), elementwise over amax (fp32)."""
    amax = amax.float()
    scale = torch.full_like(amax, fmt.max) / amax     # a true division (python / tensor is 1/x * max)
    scale = torch.where(torch.isinf(scale), torch.full_like(scale, FLT_MAX), scale)
    if pow2:         # keep the exponent bits only: round down to a power of two (NaN stays NaN)
        p2 = (scale.view(torch.int32) & 0x7F800000).view(torch.float32)
        scale = torch.where(torch.isnan(scale), scale, p2)
    one = torch.ones_like(scale)
    return torch.where((amax == 0) | torch.isinf(amax), one, scale)


def block_amax(x: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    """max |x| over each (bm, bn) block of a 2-D x (zero-padded at ragged edges) -> [M/bm, K/bn].
    A NaN in a block makes its amax NaN."""
    bm, bn = block
    m, k = x.shape
    pm, pk = -m % bm, -k % bn
    xp = torch.nn.functional.pad(x.float().abs(), (0, pk, 0, pm))
    blocks = xp.reshape((m + pm) // bm, bm, (k + pk) // bn, bn)
    amax = blocks.amax(dim=(1, 3))
    nan = blocks.isnan().any(dim=3).any(dim=1)
    return torch.where(nan, torch.full_like(amax, float("nan")), amax)


def _apply(x: torch.Tensor, scale: torch.Tensor, block, fmt: Format) -> torch.Tensor:
    bm, bn = block
    s = scale.repeat_interleave(bm, 0).repeat_interleave(bn, 1)[: x.shape[0], : x.shape[1]]
    return cast(x.float() * s, fmt)


def quantize_with_scale(x: torch.Tensor, scale: torch.Tensor, fmt: Format) -> Quantized:
    """One given per-tensor scale (fp32 scalar tensor): cast(x * scale), scale_inv = 1 / scale."""
    x2 = x.reshape(math.prod(x.shape[:-1]), x.shape[-1])   # an expert given no token: [0, C] or [C, 0]
    scale = scale.float().reshape(1, 1)
    return Quantized(_apply(x2, scale, (x2.shape[0], x2.shape[1]), fmt), 1.0 / scale,
                     (x2.shape[0], x2.shape[1]), fmt)


def quantize_tensorwise(x: torch.Tensor, fmt: Format, amax: torch.Tensor | None = None) -> Quantized:
    """Current scaling: one scale from this tensor's own amax (or a given, e.g. group-reduced, one)."""
    if amax is None:                         # no values (an expert given no token): amax 0, scale 1
        amax = x.float().abs().max() if x.numel() else torch.zeros(())
    return quantize_with_scale(x, current_scale(amax, fmt), fmt)


def quantize_blockwise(x: torch.Tensor, fmt: Format, block=(1, 128), pow2: bool = True) -> Quantized:
    """Blockwise scaling (DeepSeek-V3 section 3.3.1): a scale per (bm, bn) block of the 2-D x, from
    that block's amax; powers of two by default (Transformer Engine's Float8BlockScaling)."""
    x2 = x.reshape(math.prod(x.shape[:-1]), x.shape[-1])   # not (-1, C): an expert given no token is [C, 0]
    scale = current_scale(block_amax(x2, block), fmt, pow2=pow2)
    return Quantized(_apply(x2, scale, block, fmt), 1.0 / scale, tuple(block), fmt)


def quantize_mxfp8(x: torch.Tensor, fmt: Format, block_size: int = 32) -> Quantized:
    """MXFP8 (OCP MX v1.0): 1 x 32 blocks along the last dim, scale 2^(floor(log2 amax) - emax)
    stored as E8M0; a block holding NaN or inf gets the NaN scale (0xFF), so it dequantizes to NaN."""
    x2 = x.reshape(math.prod(x.shape[:-1]), x.shape[-1])   # an expert given no token: [0, C] or [C, 0]
    amax = block_amax(x2, (1, block_size))
    e = e8m0_exponent(torch.nan_to_num(amax, nan=0.0, posinf=0.0), fmt)
    bad = ~torch.isfinite(amax)
    data = _apply(x2, torch.ldexp(torch.ones_like(amax), -e), (1, block_size), fmt)
    scale_inv = torch.where(bad, torch.full_like(amax, float("nan")), torch.ldexp(torch.ones_like(amax), e))
    return Quantized(data, scale_inv.to(E8M0.dtype), (1, block_size), fmt)


@dataclass
class DelayedScaling:
    """Delayed scaling's state for ONE tensor: the amax history (most recent first) and the scale.

    Each ``quantize`` casts with the CURRENT scale, computed from earlier amaxes only, then records
    this tensor's amax and recomputes the scale for the next call: ``fp8_amax_compute_algo`` "max"
    (the largest of the last ``fp8_amax_history_len``) or "most_recent"; scale = (max / amax) /
    2^fp8_margin. A value beyond what the history saw saturates: the recipe's failure mode."""
    fmt: Format
    amax_history_len: int = 1024
    amax_compute_algo: str = "max"
    margin: int = 0
    scale: torch.Tensor = field(default_factory=lambda: torch.tensor(1.0))
    history: torch.Tensor | None = None

    def __post_init__(self):
        if self.amax_compute_algo not in ("max", "most_recent"):
            raise ValueError(f"fp8_amax_compute_algo is 'max' or 'most_recent', not {self.amax_compute_algo!r}")
        if self.history is None:
            self.history = torch.zeros(0)

    def quantize(self, x: torch.Tensor, amax: torch.Tensor | None = None) -> Quantized:
        """cast(x * scale) with the scale from the history, then ``update`` with x's amax."""
        q = quantize_with_scale(x, self.scale, self.fmt)
        self.update(x.float().abs().max() if amax is None else amax)
        return q

    def update(self, amax: torch.Tensor) -> None:
        """Push amax into the history (keeping the last amax_history_len), recompute the scale."""
        self.history = torch.cat([amax.float().reshape(1), self.history])[: self.amax_history_len]
        a = self.history.max() if self.amax_compute_algo == "max" else self.history[0]
        self.scale = delayed_scale(a, self.scale, self.fmt, self.margin)


def delayed_scale(amax: torch.Tensor, prev: torch.Tensor, fmt: Format, margin: int = 0) -> torch.Tensor:
    """Transformer Engine's ``_default_sf_compute``: (max / amax) / 2^margin, or ``prev`` where amax
    is 0 or not finite."""
    amax = amax.float()
    sf = (torch.full_like(amax, fmt.max) / amax) / (2.0 ** margin)
    sf = torch.where(amax > 0.0, sf, prev)
    return torch.where(torch.isfinite(amax), sf, prev)

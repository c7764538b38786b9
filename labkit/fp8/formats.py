"""The FP8 formats and the saturating cast (chapter "FP8: four ways to scale").

Three 8-bit formats carry FP8 training (Micikevicius et al. 2022, https://arxiv.org/abs/2209.05433;
OCP 8-bit Floating Point Specification OFP8 rev 1.0 and OCP Microscaling Formats (MX) v1.0):

    format      torch dtype            bits s.e.m  bias  max      min normal  min subnormal  u
    E4M3 (fn)   float8_e4m3fn          1.4.3        7    448      2^-6        2^-9           2^-4
    E5M2        float8_e5m2            1.5.2       15    57344    2^-14       2^-16          2^-3
    E8M0        float8_e8m0fnu         0.8.0      127    2^127    2^-127      (none)         -

E4M3 "fn" is finite-only (no inf; one NaN pattern per sign), E5M2 is IEEE-like (inf and NaN),
E8M0 holds a power of two only (an MX block's scale; 0xFF is NaN). u is the unit roundoff
2^-(mantissa bits + 1): a value inside the normal range is stored with relative error at most u.

``cast`` saturates, as Transformer Engine's casts do: a value beyond the format's max (inf
included) becomes +-max; NaN stays NaN; the rest rounds to nearest, ties to even.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Format:
    """An 8-bit floating-point element format."""
    name: str
    dtype: torch.dtype
    exponent_bits: int
    mantissa_bits: int
    bias: int
    max: float              # largest finite value
    min_normal: float
    min_subnormal: float

    @property
    def unit_roundoff(self) -> float:
        """u = 2^-(m+1): the largest relative rounding error inside the normal range."""
        return 2.0 ** -(self.mantissa_bits + 1)

    @property
    def emax(self) -> int:
        """The exponent of the largest normal power of two (8 for E4M3, 15 for E5M2): the OCP MX
        spec's ``emax_elem``."""
        return int(torch.tensor(self.max).log2().floor())

    @property
    def dynamic_range(self) -> float:
        """max / min subnormal: how many binades the format spans, as a ratio."""
        return self.max / self.min_subnormal


E4M3 = Format("E4M3", torch.float8_e4m3fn, 4, 3, 7, 448.0, 2.0 ** -6, 2.0 ** -9)
E5M2 = Format("E5M2", torch.float8_e5m2, 5, 2, 15, 57344.0, 2.0 ** -14, 2.0 ** -16)
E8M0 = Format("E8M0", torch.float8_e8m0fnu, 8, 0, 127, 2.0 ** 127, 2.0 ** -127, 2.0 ** -127)
FORMATS = {"E4M3": E4M3, "E5M2": E5M2}

# fp8_format (Megatron's --fp8-format): which element format each GEMM operand uses
FP8_FORMATS = {
    "e4m3": {"forward": E4M3, "backward": E4M3},     # all tensors in E4M3
    "hybrid": {"forward": E4M3, "backward": E5M2},   # E4M3 forward, E5M2 gradients (more range)
}


def cast(x: torch.Tensor, fmt: Format) -> torch.Tensor:
    """x (any float dtype) in ``fmt``'s dtype: saturated to +-max, NaN kept, round to nearest even."""
    x = x.float()
    return x.clamp(-fmt.max, fmt.max).to(fmt.dtype)      # clamp keeps NaN; inf -> +-max


def round_to(x: torch.Tensor, fmt: Format) -> torch.Tensor:
    """x rounded to ``fmt`` and back to float32 (the value an FP8 tensor would hold)."""
    return cast(x, fmt).float()


def e8m0_exponent(amax: torch.Tensor, fmt: Format) -> torch.Tensor:
    """The OCP MX shared exponent of a block: floor(log2(amax)) - emax_elem, clamped to E8M0's
    [-127, 127]; an all-zero block gets -127. int32; NaN/inf blocks are marked by the caller."""
    _, e = torch.frexp(amax.float())          # amax = m * 2^e, m in [0.5, 1): floor(log2) = e - 1
    shared = (e - 1 - fmt.emax).to(torch.int32)
    shared = torch.where(amax > 0, shared, torch.full_like(shared, -127))
    return shared.clamp(-127, 127)

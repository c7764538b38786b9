"""Unit roundoff, Higham's summation bound, and the derived drift band (pure Python, no torch).

Chapter "Low precision". A floating-point format with p significand bits (the implicit one
counted) rounds to nearest with a relative error of at most its unit roundoff u = 2^-p:

    fp32  p = 24   u = 2^-24 ~ 6.0e-8
    fp16  p = 11   u = 2^-11 ~ 4.9e-4
    bf16  p = 8    u = 2^-8  ~ 3.9e-3

A sum of n terms computed in any order differs from the exact sum by at most
gamma_{n-1} sum|x_i|, gamma_n = n u / (1 - n u) (Higham, *Accuracy and Stability of Numerical
Algorithms*, 2002, §4.2, https://doi.org/10.1137/1.9780898718027), so two orders differ by at most
twice that. A parallel layout changes the order (and the grouping) of a step's sums: each
microbatch's contribution is cut over at most w ranks and N microbatches are accumulated, so no
reordered sum has more than n = N w partial terms. :func:`derived_band` is that bound, first
order, added over k steps (it assumes the optimizer does not amplify a difference: the measured
envelopes test it); where n u >= 1 no bound exists and the band is None.

A precision is a name of :data:`PRECISIONS` or a dict of ``labkit.train`` keyword arguments
(``{"bf16": True}``; later an FP8 recipe, ``{"fp8": {...}}``), passed through unchanged.
"""
from __future__ import annotations

import math

from ..validate import int_at_least

UNIT_ROUNDOFF = {"fp32": 2.0 ** -24, "fp16": 2.0 ** -11, "bf16": 2.0 ** -8,
                 "e4m3": 2.0 ** -4, "e5m2": 2.0 ** -3, "fp64": 2.0 ** -53}

# name -> labkit.train keyword arguments (fp16: a constant loss scale, so both runs of a pair scale alike)
PRECISIONS = {"fp32": {}, "bf16": {"bf16": True}, "fp16": {"fp16": True, "loss_scale": 2.0 ** 10},
              # FP8 GEMMs (hybrid: E4M3 forward, E5M2 gradients), the rest fp32 (chapter "FP8")
              "fp8 tensorwise": {"fp8": "hybrid", "fp8_recipe": "tensorwise"},
              "fp8 delayed": {"fp8": "hybrid", "fp8_recipe": "delayed"},
              # E4M3 throughout, as DeepSeek-V3's blockwise recipe and Transformer Engine's MXFP8 default
              "fp8 blockwise": {"fp8": "e4m3", "fp8_recipe": "blockwise"},
              "fp8 mxfp8": {"fp8": "e4m3", "fp8_recipe": "mxfp8"}}


def precision_kwargs(precision) -> dict:
    """``labkit.train`` keyword arguments of a precision: a name of :data:`PRECISIONS` or a dict."""
    if isinstance(precision, dict):
        return dict(precision)
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {sorted(PRECISIONS)} or a dict of labkit.train "
                         f"keyword arguments, got {precision!r}")
    return dict(PRECISIONS[precision])


def precision_name(precision) -> str:
    """A short name: "bf16", or for a dict the format it sets ("fp8 e4m3 ...", "bf16", "fp32")."""
    if not isinstance(precision, dict):
        precision_kwargs(precision)
        return precision
    if precision.get("fp8"):
        f8 = precision["fp8"]
        return "fp8 " + " ".join(str(f8[k]) for k in ("fp8_format", "fp8_recipe") if k in f8) if isinstance(
            f8, dict) else f"fp8 {f8}"
    return "bf16" if precision.get("bf16") else "fp16" if precision.get("fp16") else \
        {"float64": "fp64"}.get(precision.get("params_dtype"), "fp32")


def unit_roundoff(precision) -> float:
    """u of the format the run computes in: the 16-bit format under bf16/fp16, E4M3's under FP8
    (its forward format; hybrid's E5M2 gradients are coarser still), else fp32 (fp64 for
    ``params_dtype="float64"``)."""
    name = precision_name(precision)
    if name.startswith("fp8"):
        return UNIT_ROUNDOFF["e5m2" if name.split()[1:2] == ["e5m2"] else "e4m3"]
    return UNIT_ROUNDOFF[name]


def gamma(n: int, u: float) -> float:
    """Higham's gamma_n = n u / (1 - n u); inf where n u >= 1 (no bound)."""
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    return math.inf if n * u >= 1 else n * u / (1 - n * u)


def reordered_terms(num_microbatches: int, world_size: int) -> int:
    """n: the most partial terms a reordered sum of one step can have (N microbatches, each cut
    over at most ``world_size`` ranks)."""
    return int_at_least("num_microbatches", num_microbatches, 1) * int_at_least("world_size", world_size, 1)


def derived_band(steps: int, u: float, n: int) -> list | None:
    """Relative band at steps 1..``steps``: k x 2 gamma_{n-1}(u) (two orders of one sum, added over
    k steps, first order); None where n u >= 1 (no bound exists)."""
    per_step = 2 * gamma(n - 1, u)
    if math.isinf(per_step):
        return None
    return [k * per_step for k in range(1, steps + 1)]


def probabilistic_band(steps: int, u: float, n: int, lam: float = 1.0) -> list:
    """The probabilistic counterpart, 2 lam sqrt(n k) u: rounding errors as independent random
    variables (Higham and Mary 2019, https://doi.org/10.1137/18M1226312), a random walk over k steps."""
    return [2 * lam * math.sqrt(n * k) * u for k in range(1, steps + 1)]

"""Checks for the FP8 lab: blockwise quantize and dequantize, and delayed scaling's amax update.

* ``blockwise-quantize``: ``blockwise_quantize(x, block, pow2)`` of a 2-D fp32 ``x`` returns
  ``(data, scale_inv)``: ``data`` in ``torch.float8_e4m3fn`` (x's shape), ``scale_inv`` fp32, one per
  (bm, bn) block, ragged blocks at the edges included. The rule is labkit's ``quantize_blockwise``
  (Transformer Engine's ``compute_scale_from_amax``): per block amax = max |x|; scale = 448 / amax
  in fp32 (inf -> FLT_MAX; with ``pow2`` rounded down to a power of two); amax 0 or inf -> scale 1;
  scale_inv = 1 / scale; data = cast(x * scale), saturating at +-448, round to nearest even.
* ``blockwise-dequantize``: ``blockwise_dequantize(data, scale_inv, block)`` = data * its block's
  scale_inv, fp32, data's shape (labkit's ``Quantized.dequantize``).
* ``amax-update`` (:mod:`labkit.check.fp8_delayed`): one step of delayed scaling.

``produce`` builds the inputs from the case alone (torch only: labkit's quantizers are banned while
the student's code runs) and returns the FP8 data as its bits (uint8); ``judge`` compares with
labkit's own recipe bit for bit and names the first block or element that differs, with the rule
it breaks. Visible cases: a 1x128 (activation) and a 128x128 (weight) tensor with a zero block, an
outlier above 448 and a ragged edge; hidden: DeepSeek-V3's plain fp32 scales (``pow2=False``), a
block holding inf, a block so small that 448 / amax overflows (``solutions/hidden/fp8-lab.json``).
"""
from __future__ import annotations

import math

from . import report
from .fp8_delayed import AMAX_UPDATE, amax_update
from .hints import asker
from .spec import Spec, call, failed, failure

WHY = "blockwise scaling is the exercise"
OWN_Q = ("labkit.fp8.scaling:quantize_blockwise", "labkit.fp8.scaling:block_amax",
         "labkit.fp8.scaling:current_scale", "labkit.fp8.scaling:_apply", "labkit.fp8.scaling:quantize_mxfp8")
OWN_DQ = ("labkit.fp8.scaling:Quantized.dequantize", "labkit.fp8.scaling:Quantized.expanded_scale_inv")
FP8_MAX = 448.0


def example(shape, block, seed: int, specials=()) -> "torch.Tensor":
    """The case's input [m, k] fp32: rows 2^-8..2^8 apart; ``specials``: "zero" (block (0, last)
    all zero), "outlier" (x[m-1, 0] = 1000, above 448), "tiny" (block (last, last) times 1e-40, so
    448 / amax overflows fp32), "inf" (x[0, 0] = inf)."""
    import torch
    m, k = shape
    bm, bn = block
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g) * torch.exp2(torch.randint(-8, 9, (m, 1), generator=g).float())
    last_r, last_c = (m - 1) // bm * bm, (k - 1) // bn * bn     # where the last (ragged) blocks start
    for s in specials:
        if s == "zero":
            x[:bm, last_c:] = 0.0
        elif s == "outlier":
            x[m - 1, 0] = 1000.0
        elif s == "tiny":
            x[last_r:, last_c:] *= 1e-40
        elif s == "inf":
            x[0, 0] = float("inf")
    return x


def _name(kind, shape, block, pow2=None) -> str:
    scales = "" if pow2 is None else (", power-of-two scales" if pow2 else ", fp32 scales")
    return f"{kind} ({shape[0]}x{shape[1]}, {block[0]}x{block[1]} blocks{scales})"


def _grid(shape, block) -> tuple:
    return math.ceil(shape[0] / block[0]), math.ceil(shape[1] / block[1])


# -- blockwise-quantize ------------------------------------------------------------------------
def _produce_q(student, shape, block, seed=0, pow2=True, specials=()):
    import torch
    fn = student.load()["quantize"]
    with student.banning(OWN_Q, WHY):
        out, bad = call(fn, example(shape, block, seed, specials), tuple(block), pow2=pow2)
    if bad:
        return bad
    if not (isinstance(out, tuple) and len(out) == 2 and all(type(t) is torch.Tensor for t in out)):
        return failure("invalid", f"blockwise_quantize returned {type(out).__name__}, not (data, scale_inv): "
                       "two tensors")
    data, scale_inv = out
    if data.dtype != torch.float8_e4m3fn or scale_inv.dtype != torch.float32:
        return failure("invalid", f"data is {data.dtype} and scale_inv {scale_inv.dtype}: expected "
                       "torch.float8_e4m3fn (E4M3) and torch.float32")
    return {"bits": data.view(torch.uint8).clone(), "scale_inv": scale_inv.detach().clone()}


def _pow2(scale, pow2: bool):
    """``scale`` rounded down to a power of two (its exponent bits) when ``pow2``."""
    import torch
    return (scale.view(torch.int32) & 0x7F800000).view(torch.float32) if pow2 else scale


def _scale_hint(amax, got, i: int, j: int, pow2: bool) -> str:
    """The rule block (i, j)'s wrong scale breaks: a rule of its own (zero, inf, overflow), or a
    formula the WHOLE grid ``got`` follows (pow2 forgotten, amax / 448, a Python float division)."""
    import torch
    a = float(amax[i, j])
    if a == 0:
        return "an all-zero block: amax 0 gives scale 1 (Transformer Engine's rule), so scale_inv 1"
    if math.isinf(a):
        return "a block holding inf: amax inf gives scale 1, so scale_inv 1 (the inf saturates to 448)"
    raw = torch.full_like(amax, FP8_MAX) / amax                         # the rule's own division
    if torch.isinf(raw[i, j]):
        return ("448 / amax overflows fp32 in this block: the scale is then FLT_MAX "
                "(torch.finfo(torch.float32).max)" + (", then rounded down to a power of two" if pow2 else ""))
    plain = (amax > 0) & torch.isfinite(amax) & torch.isfinite(raw)      # blocks of no special rule
    follows = lambda want: bool((want.view(torch.int32) == got.view(torch.int32))[plain].all())  # noqa: E731
    if pow2 and follows(1.0 / raw):
        return ("pow2: round the scale DOWN to a power of two (keep its exponent bits: "
                "(s.view(torch.int32) & 0x7F800000).view(torch.float32)), then scale_inv = 1 / scale")
    if not pow2 and follows(amax / FP8_MAX):
        return ("scale_inv here is 1 / (448 / amax): compute scale = 448 / amax in fp32 first, as labkit "
                "and Transformer Engine do; amax / 448 differs from it in the last bit for some amaxes")
    if follows(1.0 / _pow2(FP8_MAX / amax, pow2)):                       # torch: 448.0 / a = 448 * (1 / a)
        return ("compute 448 / amax as a division of two tensors (torch.full_like(amax, 448.0) / amax): "
                "torch computes the Python float 448.0 / amax as 448 * (1 / amax), which rounds twice")
    return "per block: amax = max |x| over the block's own elements, scale = 448 / amax (fp32), scale_inv = 1 / scale"


def _judge_q(data, shape, block, seed=0, pow2=True, specials=()):
    import torch

    from ..fp8 import E4M3, quantize_blockwise
    from ..fp8.scaling import block_amax
    name = _name("blockwise_quantize", shape, block, pow2)
    bad = failed(name, data, "blockwise_quantize returns (data, scale_inv): data in torch.float8_e4m3fn")
    if bad is not None:
        return bad
    x = example(shape, block, seed, specials)
    q = quantize_blockwise(x, E4M3, tuple(block), pow2=pow2)
    if type(data) is not dict:
        return report(name, False, f"got {type(data).__name__}, expected the data and scales")
    bits, s = data.get("bits"), data.get("scale_inv")
    if not isinstance(bits, torch.Tensor) or tuple(bits.shape) != tuple(shape):
        return report(name, False, f"data of shape {None if bits is None else tuple(bits.shape)}, expected "
                      f"{tuple(shape)}", "data has x's shape: one FP8 element per element of x")
    grid = _grid(shape, block)
    if not isinstance(s, torch.Tensor) or tuple(s.shape) != grid or s.dtype != torch.float32:
        got = "no tensor" if not isinstance(s, torch.Tensor) else f"{tuple(s.shape)} {s.dtype}"
        return report(name, False, f"scale_inv is {got}, expected {grid} torch.float32",
                      f"one fp32 scale per block, the ragged last blocks included: ceil({shape[0]} / {block[0]}) "
                      f"x ceil({shape[1]} / {block[1]})")
    amax = block_amax(x, tuple(block))
    off = s.view(torch.int32) != q.scale_inv.view(torch.int32)
    if bool(off.any()):
        i, j = (int(v) for v in off.nonzero()[0])
        got, want = float(s[i, j]), float(q.scale_inv[i, j])
        ulps = abs(int(s.view(torch.int32)[i, j]) - int(q.scale_inv.view(torch.int32)[i, j]))
        apart = " (1 unit in the last place apart)" if ulps == 1 else ""
        return report(name, False, f"block ({i}, {j}): scale_inv {got:.9g}, expected {want:.9g}{apart} (the "
                      f"block's amax is {float(amax[i, j]):.9g}; {int(off.sum())} of {off.numel()} blocks off)",
                      _scale_hint(amax, s, i, j, pow2))
    want_bits = q.data.view(torch.uint8)
    off = bits != want_bits
    if bool(off.any()):
        r, c = (int(v) for v in off.nonzero()[0])
        fp8 = lambda b: float(torch.tensor([b], dtype=torch.uint8).view(torch.float8_e4m3fn).float())  # noqa: E731
        gb, wb = int(bits[r, c]), int(want_bits[r, c])
        xs = float(x[r, c] * (1.0 / q.scale_inv[r // block[0], c // block[1]]))
        hint = ("a value beyond 448 must saturate to +-448: clamp(-448, 448), then .to(torch.float8_e4m3fn)"
                if abs(xs) > FP8_MAX else
                "data = (x * scale).to(torch.float8_e4m3fn) with the block's scale (multiply by scale, the "
                "cast rounds to nearest even)")
        return report(name, False, f"element ({r}, {c}) in block ({r // block[0]}, {c // block[1]}): 0x{gb:02x} "
                      f"= {fp8(gb):g}, expected 0x{wb:02x} = {fp8(wb):g} (x = {float(x[r, c]):.6g}, x * scale = "
                      f"{xs:.6g}; {int(off.sum())} of {off.numel()} elements off)", hint)
    extra = [w for w, on in (("a zero block", "zero" in specials), ("an outlier above 448", "outlier" in specials),
                             ("a block holding inf", "inf" in specials), ("a scale that overflows", "tiny" in specials),
                             ("a ragged edge", shape[0] % block[0] or shape[1] % block[1])) if on]
    return report(name, True, f"the FP8 bits and all {grid[0] * grid[1]} block scales equal labkit's "
                  f"quantize_blockwise bit for bit" + (f" ({', '.join(extra)})" if extra else ""))


# -- blockwise-dequantize ----------------------------------------------------------------------
def fp8_example(shape, block, seed: int, pow2: bool):
    """(data [m, k] E4M3 from random bits, NaN patterns 0x7f/0xff excluded; scale_inv per block, fp32)."""
    import torch
    g = torch.Generator().manual_seed(seed)
    bits = torch.randint(0, 254, tuple(shape), generator=g, dtype=torch.uint8)
    bits = bits + (bits >= 0x7F).to(torch.uint8)                 # skip 0x7f; 253 -> 254 < 0xff
    grid = _grid(shape, block)
    scale_inv = torch.exp2(torch.randint(-12, 6, grid, generator=g).float())
    if not pow2:
        scale_inv = scale_inv * (1 + torch.rand(grid, generator=g))
    return bits.view(torch.float8_e4m3fn), scale_inv


def _produce_dq(student, shape, block, seed=0, pow2=True):
    import torch
    fn = student.load()["dequantize"]
    data, scale_inv = fp8_example(shape, block, seed, pow2)
    with student.banning(OWN_DQ, WHY):
        out, bad = call(fn, data, scale_inv, tuple(block))
    if bad:
        return bad
    if type(out) is not torch.Tensor or out.dtype != torch.float32:
        what = out.dtype if type(out) is torch.Tensor else type(out).__name__
        return failure("invalid", f"blockwise_dequantize returned {what}, not a torch.float32 tensor")
    return out.detach().clone()


def _judge_dq(data, shape, block, seed=0, pow2=True):
    import torch

    from ..fp8 import E4M3, Quantized
    name = _name("blockwise_dequantize", shape, block)
    bad = failed(name, data, "blockwise_dequantize returns one fp32 tensor of data's shape")
    if bad is not None:
        return bad
    if type(data) is not torch.Tensor:
        return report(name, False, f"got {type(data).__name__}, expected a tensor")
    q8, scale_inv = fp8_example(shape, block, seed, pow2)
    want = Quantized(q8, scale_inv, tuple(block), E4M3).dequantize()
    if tuple(data.shape) != tuple(shape) or data.dtype != torch.float32:
        return report(name, False, f"{tuple(data.shape)} {data.dtype}, expected {tuple(shape)} torch.float32",
                      "one fp32 value per element: repeat each block's scale_inv over its block, then crop "
                      "to data's shape at the ragged edge")
    off = ~((data == want) | (data.isnan() & want.isnan()))
    if not bool(off.any()):
        return report(name, True, "equals labkit's Quantized.dequantize bit for bit (every element times its "
                      "block's scale_inv" + (", ragged edge included)" if shape[1] % block[1] or shape[0] % block[0]
                                             else ")"))
    r, c = (int(v) for v in off.nonzero()[0])
    bi, bj = r // block[0], c // block[1]
    v, s = float(q8[r, c].float()), float(scale_inv[bi, bj])
    got = float(data[r, c])
    divided = float(q8[r, c].float() / scale_inv[bi, bj])            # in fp32, as the answer computed it
    hint = ("multiply by scale_inv (the dequantization factor), do not divide" if got == divided else
            f"element ({r}, {c}) belongs to block ({r} // {block[0]}, {c} // {block[1]}) = ({bi}, {bj})")
    return report(name, False, f"element ({r}, {c}): {got:.7g}, expected {v:g} x {s:.7g} = {float(want[r, c]):.7g} "
                  f"({int(off.sum())} of {off.numel()} elements off)", hint)


QUANTIZE = Spec(
    "blockwise-quantize", {"quantize": "blockwise_quantize"}, _produce_q, _judge_q,
    cases=({"shape": [8, 320], "block": [1, 128], "seed": 0, "pow2": True, "specials": ["zero", "outlier"]},
           {"shape": [256, 384], "block": [128, 128], "seed": 1, "pow2": True, "specials": ["zero", "outlier"]}),
    forbid=OWN_Q, why=WHY, hints=(
        "pad x with zeros to whole blocks (torch.nn.functional.pad), reshape to [M/bm, bm, K/bn, bn] and take "
        "abs().amax(dim=(1, 3)): one amax per block (zeros never raise an amax)",
        "scale = 448 / amax; where it is inf, FLT_MAX; with pow2 keep its exponent bits only; where amax is 0 "
        "or inf, 1. scale_inv = 1 / scale",
        "repeat_interleave the scales to whole blocks, crop to x's shape, then (x * scale).clamp(-448, 448)"
        ".to(torch.float8_e4m3fn)"))
DEQUANTIZE = Spec(
    "blockwise-dequantize", {"dequantize": "blockwise_dequantize"}, _produce_dq, _judge_dq,
    cases=({"shape": [4, 300], "block": [1, 128], "seed": 0, "pow2": False},
           {"shape": [200, 256], "block": [128, 128], "seed": 1, "pow2": True}),
    forbid=OWN_DQ, why=WHY, hints=(
        "scale_inv.repeat_interleave(bm, 0).repeat_interleave(bn, 1) is one scale per element of whole blocks",
        "crop it to data.shape, then data.float() * that"))
SPECS = {"blockwise-quantize": QUANTIZE, "blockwise-dequantize": DEQUANTIZE, "amax-update": AMAX_UPDATE}
hint = asker(SPECS)


def _each(spec, objects) -> bool:
    from .spec import run
    return all([bool(run(spec, objects, **case)) for case in spec.cases])


def blockwise_quantize(fn) -> bool:
    """Run ``fn`` on the visible cases (1x128 and 128x128 blocks); print one [check] line each."""
    return _each(QUANTIZE, {"quantize": fn})


def blockwise_dequantize(fn) -> bool:
    """Run ``fn`` on the visible cases; print one [check] line each."""
    return _each(DEQUANTIZE, {"dequantize": fn})


__all__ = ["blockwise_quantize", "blockwise_dequantize", "amax_update", "hint", "SPECS", "example"]

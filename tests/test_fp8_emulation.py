"""labkit.fp8 against an independent reference, bit for bit (chapter "FP8: four ways to scale").

The reference is written once, here, from the definitions and nothing of labkit.fp8 or of torch's
float8 casts: rounding into a format from its exponent/mantissa/bias (OCP OFP8), Transformer
Engine's documented scale rules (compute_scale_from_amax, _default_sf_compute) and the OCP MX v1.0
shared-exponent rule, in numpy float64/float32. "Bit for bit": equal values, the same sign of
zero, NaN at the same places, on 10^6 values and the edge cases.
"""
import numpy as np
import pytest
import torch

from labkit import fp8
from labkit.fp8 import E4M3, E5M2

N = 2 ** 20        # 1,048,576 values: divisible by every block
FMTS = [E4M3, E5M2]


# ---------------------------------------------------------------- the reference, once
def ref_round(y, fmt):
    """y (float64 array) rounded to fmt: saturate to +-max, NaN kept, round to nearest even."""
    y = np.asarray(y, dtype=np.float64)
    a = np.minimum(np.abs(y), fmt.max)                      # NaN propagates, inf -> max
    _, e2 = np.frexp(a)                                     # a = f 2^e2, f in [0.5, 1)
    e = np.maximum(e2 - 1, 1 - fmt.bias)                    # below the normal range: subnormal spacing
    quantum = np.ldexp(1.0, (e - fmt.mantissa_bits).astype(np.int64))
    r = np.minimum(np.rint(a / quantum) * quantum, fmt.max)  # np.rint: half to even
    return np.copysign(r, y)


def ref_current_scale(amax, fmax, pow2=False):
    """Transformer Engine's compute_scale_from_amax (epsilon 0) in float32, elementwise."""
    amax = np.asarray(amax, dtype=np.float32)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        s = np.float32(fmax) / amax
    s = np.where(np.isinf(s), np.finfo(np.float32).max, s).astype(np.float32)
    if pow2:                                   # round down to a power of two; NaN stays NaN
        _, e2 = np.frexp(np.where(np.isfinite(s), s, 1.0))
        s = np.where(np.isfinite(s), np.ldexp(1.0, e2 - 1), s).astype(np.float32)
    return np.where((amax == 0) | np.isinf(amax), np.float32(1.0), s).astype(np.float32)


def ref_scaled_cast(x32, scale32, fmt):
    """cast(x * scale): the product in float32 (as TE computes it), then rounded."""
    with np.errstate(over="ignore", invalid="ignore"):
        return ref_round((x32 * scale32).astype(np.float64), fmt)


def ref_mx(x32, fmt, k=32):
    """OCP MX v1.0: per 1 x k block X = 2^(floor(log2 amax) - emax_elem) clamped to E8M0, or NaN
    for a block holding NaN/inf, 2^-127 for an all-zero one; P = round(V / X)."""
    rows = x32.reshape(-1, k).astype(np.float64)
    amax = np.abs(rows).max(axis=1)
    bad = ~np.isfinite(amax)
    emax = {"E4M3": 8, "E5M2": 15}[fmt.name]
    _, e2 = np.frexp(np.where(bad, 1.0, amax))
    e = np.clip(np.where(amax > 0, e2 - 1 - emax, -127), -127, 127)
    e = np.where(bad, 0, e)
    data = ref_round(rows / np.ldexp(1.0, e)[:, None], fmt)
    scale = np.where(bad, np.nan, np.ldexp(1.0, e))
    return data.reshape(x32.shape), scale


# ---------------------------------------------------------------- helpers
def same(got, want):
    """Bit-for-bit on the values a format holds: values, zero's sign, NaN places. -> (equal, total)"""
    with np.errstate(invalid="ignore"):
        got = np.asarray(got, dtype=np.float64).ravel()
    want = np.asarray(want, dtype=np.float64).ravel()
    nan = np.isnan(got) & np.isnan(want)
    ok = nan | ((got == want) & (np.signbit(got) == np.signbit(want)))
    return int(ok.sum()), got.size


def wide_values(n=N, seed=0):
    """n float32 values over every binade FP8 can meet (2^-30 .. 2^30: subnormals, overflow), both
    signs, ties (exact midpoints) and the specials."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g) * torch.exp2(torch.randint(-30, 30, (n,), generator=g).float())
    ties = torch.tensor([0.5 + 2 ** -5, 2 ** -10, 3 * 2 ** -10, 464.0, 480.0, 61440.0, 2 ** -17, 2 ** -8 * 1.0625])
    special = torch.tensor([0.0, -0.0, float("inf"), -float("inf"), float("nan"), 448.0, 449.0, 57344.0,
                            -1e30, 2.0 ** -9, 2.0 ** -16, 2.0 ** -149, -(2.0 ** -10)])
    x[: len(ties)] = ties
    x[len(ties): len(ties) + len(special)] = special
    return x


# ---------------------------------------------------------------- casts and formats
@pytest.mark.parametrize("fmt", FMTS, ids=lambda f: f.name)
def test_cast_equals_reference_bit_for_bit_on_a_million_values(fmt):
    x = wide_values()
    eq, n = same(fp8.round_to(x, fmt).numpy(), ref_round(x.double().numpy(), fmt))
    assert (eq, n) == (N, N)


def test_formats_constants_from_the_definition():
    for fmt in FMTS:
        top = ref_round(np.array([1e30]), fmt)[0]
        assert top == fmt.max == torch.finfo(fmt.dtype).max
        assert fmt.min_subnormal == 2.0 ** (1 - fmt.bias - fmt.mantissa_bits)
        assert fmt.unit_roundoff == 2.0 ** -(fmt.mantissa_bits + 1)
    assert (E4M3.emax, E5M2.emax) == (8, 15)


# ---------------------------------------------------------------- the four recipes
def _shaped(n=N, k=128, seed=1):
    return wide_values(n, seed).reshape(-1, k)


@pytest.mark.parametrize("fmt", FMTS, ids=lambda f: f.name)
def test_tensorwise_equals_reference(fmt):
    x = _shaped()
    x = torch.where(torch.isfinite(x), x, torch.zeros_like(x))   # one NaN would make the amax NaN
    q = fp8.quantize_tensorwise(x, fmt)
    s = ref_current_scale(np.abs(x.numpy()).max(), fmt.max)
    assert q.scale_inv.item() == np.float32(1) / s
    assert same(q.data.float().numpy(), ref_scaled_cast(x.numpy(), s, fmt)) == (N, N)


@pytest.mark.parametrize("block", [(1, 128), (128, 128), (1, 32)])
@pytest.mark.parametrize("fmt", FMTS, ids=lambda f: f.name)
def test_blockwise_equals_reference(fmt, block):
    x = _shaped()
    q = fp8.quantize_blockwise(x, fmt, block)
    xs = x.numpy()
    bm, bk = block
    blocks = np.abs(xs).reshape(xs.shape[0] // bm, bm, xs.shape[1] // bk, bk)
    amax = blocks.max(axis=(1, 3))
    scale = ref_current_scale(amax, fmt.max, pow2=True)
    full = np.repeat(np.repeat(scale, bm, 0), bk, 1)
    assert same(q.scale_inv.numpy(), np.float32(1) / scale) == (scale.size, scale.size)
    assert same(q.data.float().numpy(), ref_scaled_cast(xs, full, fmt)) == (N, N)


@pytest.mark.parametrize("fmt", FMTS, ids=lambda f: f.name)
def test_mxfp8_equals_the_ocp_mx_spec(fmt):
    x = _shaped()
    x[0, :32] = 0.0                                # an all-zero block
    x[1, :32] = 3.0                                # an all-equal block
    x[2, 5] = float("nan")                         # a NaN block
    x[3, 7] = float("inf")                         # an inf block
    x[4, :32] = 2.0 ** -140                        # tiny: the scale clamps at 2^-127
    q = fp8.quantize_mxfp8(x, fmt)
    data, scale = ref_mx(x.numpy(), fmt)
    assert same(q.scale_inv.float().numpy(), scale) == (scale.size, scale.size)
    bad = np.repeat(np.isnan(scale), 32)
    got = q.data.float().numpy().ravel()
    assert same(got[~bad], data.ravel()[~bad]) == (int((~bad).sum()),) * 2
    assert torch.isnan(q.dequantize().ravel()[torch.from_numpy(bad)]).all()


def test_edge_blocks_dequantize_as_defined():
    x = torch.zeros(2, 128)
    x[1] = 7.0
    for q in (fp8.quantize_blockwise(x, E4M3), fp8.quantize_mxfp8(x, E4M3), fp8.quantize_tensorwise(x, E4M3)):
        assert torch.equal(q.dequantize(), x)        # zero and all-equal blocks come back exactly


@pytest.mark.parametrize("algo", ["max", "most_recent"])
def test_delayed_scaling_equals_te_rule(algo):
    g = torch.Generator().manual_seed(2)
    amaxes = [0.5, 3.0, 0.0, float("inf"), 0.01, 100.0, 1.0, 2.0]
    state = fp8.DelayedScaling(E4M3, amax_history_len=3, amax_compute_algo=algo, margin=1)
    hist, scale = [], np.float32(1.0)
    for a in amaxes:
        x = torch.randn(16, 32, generator=g)
        x = x / x.abs().max() * a if np.isfinite(a) and a > 0 else torch.full((16, 32), a)
        q = state.quantize(x)
        assert same(q.data.float().numpy(), ref_scaled_cast(x.numpy(), scale, E4M3)) == (512, 512)
        hist = ([np.abs(x.numpy()).max()] + hist)[:3]
        h = np.float32(max(hist) if algo == "max" else hist[0])
        if np.isfinite(h) and h > 0:
            scale = np.float32(np.float32(np.float32(E4M3.max) / h) / np.float32(2.0))
        assert state.scale.item() == scale


def test_delayed_scaling_saturates_a_spike_outside_its_history():
    state = fp8.DelayedScaling(E4M3, amax_history_len=4)
    for _ in range(4):
        state.quantize(torch.linspace(-1, 1, 64))
    spike = torch.linspace(-1, 1, 64) * 100
    q = state.quantize(spike)
    assert (q.data.float().abs() == E4M3.max).sum() > 50          # clipped to max: a silent error
    assert (q.dequantize() - spike).abs().max() > 90
    err = (fp8.quantize_tensorwise(spike, E4M3).dequantize() - spike).abs() / spike.abs().clamp(min=1e-30)
    assert err.max() <= E4M3.unit_roundoff                          # current scaling: no clipping


# ---------------------------------------------------------------- the GEMM
def _operands(m=48, n=40, k=256, seed=3):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(m, k, generator=g), torch.randn(n, k, generator=g)


def test_dequantize_gemm_equals_torch_scaled_mm_tensorwise_and_rowwise():
    a, b = _operands()
    qa, qb = fp8.quantize_tensorwise(a, E4M3), fp8.quantize_tensorwise(b, E4M3)
    want = torch._scaled_mm(qa.data, qb.data.t(), scale_a=qa.scale_inv.reshape(()),
                            scale_b=qb.scale_inv.reshape(()), out_dtype=torch.float32)
    got = fp8.dequantize_gemm(qa, qb)
    assert int((got == want).sum()) == got.numel()
    ra, rb = fp8.quantize_blockwise(a, E4M3, (1, 256)), fp8.quantize_blockwise(b, E5M2, (1, 256))
    want = torch._scaled_mm(ra.data, rb.data.t(), scale_a=ra.scale_inv, scale_b=rb.scale_inv.t(),
                            out_dtype=torch.float32)
    for got in (fp8.dequantize_gemm(ra, rb), fp8.gemm(ra, rb)):
        assert int((got == want).sum()) == got.numel()


def test_blockwise_gemm_is_exact_per_block():
    a, b = _operands(k=512)
    qa, qb = fp8.quantize_blockwise(a, E4M3), fp8.quantize_blockwise(b, E4M3, (128, 128))
    exact = qa.dequantize().double() @ qb.dequantize().double().T
    got = fp8.gemm(qa, qb)
    err = ((got.double() - exact).abs() / exact.abs().max()).max().item()
    assert err < 4 * 2.0 ** -24 * 4        # fp32 sums of 128 exact products, 4 promotions
    assert not torch.equal(fp8.gemm(qa, qb, accum_bits=14), got)


def test_truncate_mantissa_equals_reference():
    x = wide_values(10_000, seed=4)
    x = x[torch.isfinite(x)]
    for bits in (14, 20, 24):
        got = fp8.truncate_mantissa(x, bits).double().numpy()
        xd = x.double().numpy()
        _, e2 = np.frexp(xd)
        q = np.ldexp(1.0, e2 - bits)                 # the last kept bit, normal fp32 values
        want = np.trunc(xd / q) * q
        normal = np.abs(xd) >= 2.0 ** -126
        assert same(got[normal], want[normal]) == (int(normal.sum()),) * 2


def test_promotion_every_128_bounds_the_accumulation_error():
    g = torch.Generator().manual_seed(5)
    a, b = torch.rand(16, 4096, generator=g), torch.rand(16, 4096, generator=g)
    qa, qb = fp8.quantize_tensorwise(a, E4M3), fp8.quantize_tensorwise(b, E4M3)
    never = fp8.accumulation_error(qa, qb, promote_every=4096)
    every = fp8.accumulation_error(qa, qb, promote_every=128)
    assert every < 2.0 ** -9 < never           # 14-bit accumulator: ~2^-10 after promotion


# ---------------------------------------------------------------- optional: torchao's quantizer
def test_mxfp8_equals_torchao_to_mx():
    mx = pytest.importorskip("torchao.prototype.mx_formats.mx_tensor",
                             reason="torchao is not installed (optional reference)")
    x = _shaped(k=256)
    x = torch.where(torch.isfinite(x), x, torch.zeros_like(x))
    for fmt in FMTS:
        scale, data = mx.to_mx(x, fmt.dtype, 32)
        q = fp8.quantize_mxfp8(x, fmt)
        assert torch.equal(scale.view(torch.uint8).reshape(-1), q.scale_inv.view(torch.uint8).reshape(-1))
        assert torch.equal(data.view(torch.uint8).reshape(-1), q.data.view(torch.uint8).reshape(-1))


def test_an_expert_given_no_token_quantizes_to_empty():
    """Top-1 routing can leave an expert without tokens: its input [0, h] and the transpose [h, 0]
    the weight-gradient GEMM reads (found by the FP8 envelope run of EP, ``labkit.drift``)."""
    scale = torch.tensor(2.0)
    for shape in ((0, 8), (8, 0)):
        q = fp8.quantize_with_scale(torch.empty(shape), scale, E4M3)
        assert tuple(q.data.shape) == shape and q.dequantize().numel() == 0
    for quantize in (fp8.quantize_blockwise, fp8.quantize_mxfp8, fp8.quantize_tensorwise):
        for shape in ((0, 64), (64, 0)):         # blockwise and MXFP8 once reshaped (-1, 0): an error
            q = quantize(torch.empty(shape), E4M3)
            assert tuple(q.data.shape) == shape and q.dequantize().numel() == 0, (quantize.__name__, shape)

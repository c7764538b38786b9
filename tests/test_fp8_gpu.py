"""torch._scaled_mm on a GPU against labkit.fp8's emulation (chapter "FP8: four ways to scale").

On the CPU, ``torch._scaled_mm`` dequantizes and multiplies in fp32, and labkit.fp8 equals it bit for
bit (tests/test_fp8_emulation.py). On an FP8 tensor core (sm_89 and later) the products are exact and
the sums are the hardware's, so the claim here is the rounding-error bound of an fp32 accumulation:
element for element, |gpu - exact| <= K u sum_k |a_k b_k| (+ the output's own rounding), where exact
is the float64 product of the same dequantized operands, u = 2^-24. A wrong scale, a transposed
operand or a wrong block would miss it by orders of magnitude. tests/bench_gpu_extras.py measures
the errors (and the fast-accumulation mode, which this bound does not cover) and the TFLOP/s.
"""
import pytest
import torch

from labkit import fp8
from labkit.fp8 import E4M3, E5M2

U32 = 2.0 ** -24


def _fp8_gpu() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() >= (8, 9)


def _operands(m, n, k, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(m, k, generator=g), torch.randn(n, k, generator=g)


def _bound(qa, qb, out_unit_roundoff: float):
    """(exact float64 product, elementwise bound) of an fp32-accumulated GEMM, output rounded."""
    da, db = qa.dequantize().double(), qb.dequantize().double()
    exact = da @ db.T
    k = da.shape[1]
    return exact, k * U32 * (da.abs() @ db.abs().T) + out_unit_roundoff * exact.abs()


@pytest.mark.gpu(devices=1)
@pytest.mark.parametrize("fmt_b", [E4M3, E5M2], ids=["e4m3 x e4m3", "e4m3 x e5m2"])
def test_scaled_mm_tensorwise_on_cuda_is_within_fp32_accumulation_of_the_emulation(fmt_b):
    if not _fp8_gpu():
        pytest.skip("FP8 tensor cores need compute capability 8.9 or later")
    a, b = _operands(256, 192, 4096, seed=11)
    qa, qb = fp8.quantize_tensorwise(a, E4M3), fp8.quantize_tensorwise(b, fmt_b)
    got = torch._scaled_mm(qa.data.cuda(), qb.data.cuda().t(), scale_a=qa.scale_inv.reshape(()).cuda(),
                           scale_b=qb.scale_inv.reshape(()).cuda(), out_dtype=torch.float32,
                           use_fast_accum=False).cpu().double()
    exact, bound = _bound(qa, qb, 0.0)
    assert bool(((got - exact).abs() <= bound).all()), float(((got - exact).abs() / bound).max())
    emulated = fp8.dequantize_gemm(qa, qb).double()                     # the CPU's fp32 answer
    assert bool(((got - emulated).abs() <= 2 * bound).all())


@pytest.mark.gpu(devices=1)
def test_scaled_mm_rowwise_on_cuda_is_within_fp32_accumulation_and_bf16_output():
    if not _fp8_gpu():
        pytest.skip("FP8 tensor cores need compute capability 8.9 or later")
    a, b = _operands(256, 192, 4096, seed=12)
    qa, qb = fp8.quantize_blockwise(a, E4M3, (1, 4096)), fp8.quantize_blockwise(b, E4M3, (1, 4096))
    got = torch._scaled_mm(qa.data.cuda(), qb.data.cuda().t(), scale_a=qa.scale_inv.float().cuda(),
                           scale_b=qb.scale_inv.float().t().cuda(), out_dtype=torch.bfloat16,
                           use_fast_accum=False).cpu().double()
    exact, bound = _bound(qa, qb, 2.0 ** -8)                            # bf16: 8 significant bits
    assert bool(((got - exact).abs() <= bound).all()), float(((got - exact).abs() / bound).max())

"""The step-time model's physical terms against the published figures they come from
(labkit/calc/kernels.py, hardware.py): attention kernel throughput, FP8, NCCL's latency model."""
import pytest

import labkit.calc as c
from labkit.calc import kernels
from labkit.calc.hardware import nccl_ring_latency
from labkit.calc.perf import FITTED


@pytest.mark.parametrize("key", sorted(kernels.PUBLISHED))
def test_each_attention_curve_reproduces_its_published_bars(key):
    # E_inf s / (s + s_0), solved on the bars, lands within 4% of every FlashAttention-2 and cuDNN
    # bar; FlashAttention-1's and Triton's bars are not monotone in s (H100 FA-1: 109 at 1K, 108 at
    # 2K), so the smooth curve keeps within 12% of them
    e_inf, s0 = kernels.CURVES[key]
    tol = 0.04 if key[0] in ("fa2", "cudnn") else 0.12
    for s, published in zip(kernels.SEQS, kernels.PUBLISHED[key]):
        assert e_inf * s / (s + s0) == pytest.approx(published, rel=tol), (key, s)


def test_attention_throughput_published_points():
    # FlashAttention-2 paper Fig. 4(d): A100, causal, head dim 128, fwd+bwd: 99 TFLOP/s at 512, 189 at 16K
    f, b = kernels.attention_tflops("fa2", "A100", 128, 512)
    assert f == b and f == pytest.approx(99, rel=0.03)
    assert kernels.attention_tflops("fa2", "A100", 128, 16384)[0] == pytest.approx(189, rel=0.03)
    # FlashAttention-3 paper Fig. 5(d): cuDNN forward, H100, causal, head dim 128: 539 TFLOP/s at 16K
    assert kernels.attention_tflops("cudnn", "H100", 128, 16384)[0] == pytest.approx(539, rel=0.03)
    # FA-2's H100 backward follows from its forward (FA-3 Fig. 5) and forward+backward (FA-2 Fig. 6)
    f2, b2 = kernels.attention_tflops("fa2", "H100", 128, 16384)
    assert 3.5 / (1 / f2 + 2.5 / b2) == pytest.approx(328, rel=0.03)


def test_attention_runs_closer_to_peak_as_keys_grow():
    gpu = c.GPUS["H100-80GB"]
    for cls, kernel in (("megatron", "cudnn"), ("fsdp", "fa2")):
        effs = [kernels.attention_efficiency(gpu, "flash", cls, 128, s)[0] for s in (1024, 8192, 131072)]
        assert effs[0] < effs[1] < effs[2] < 1
        assert kernels.attention_kernel("flash", cls, "H100") == kernel
    # head dim 96 sits between 64 and 128 (FA-2 A100 curves), clamped outside
    t = {d: kernels.attention_tflops("fa2", "A100", d, 4096)[0] for d in (32, 64, 96, 128, 256)}
    assert t[32] == t[64] < t[96] < t[128] == t[256]
    with pytest.raises(ValueError, match="kernel"):
        kernels.attention_tflops("fa9", "A100", 64, 1024)


def test_long_sequences_are_attention_bound_and_faster_than_a_short_sequence_fit_says():
    # the pattern: an attention efficiency fitted at 2K is too low at 128K
    gpu = c.GPUS["H100-80GB"]
    short = kernels.attention_efficiency(gpu, "flash", "megatron", 128, 2048)[0]
    long = kernels.attention_efficiency(gpu, "flash", "megatron", 128, 131072)[0]
    assert long / short > 1.15


def test_fp8_peak_ratio_per_generation_and_fitted_ratio_below_published():
    # datasheets: H100 and H200 1,979 vs 989 dense TFLOP/s, B200 4.5 vs 2.25 PFLOP/s; no FP8 on A100
    for name in ("H100-80GB", "H200-141GB", "B200-180GB"):
        g = c.GPUS[name]
        assert g.peak_fp8_flops / g.peak_flops == pytest.approx(2.0, rel=0.01)
        assert kernels.fp8_gemm_speedup(g, 0.8) == pytest.approx(1.6, rel=0.01)
    assert kernels.fp8_gemm_speedup(c.GPUS["A100-80GB"]) == 1.0
    # pytorch/ao roofline_utils: large FP8 GEMMs reach 77.5% of peak, BF16 69%: an upper bound
    assert kernels.fp8_gemm_speedup(c.GPUS["H100-80GB"]) == pytest.approx(2 * 0.775 / 0.69, rel=0.01)
    assert 0.5 < FITTED.fp8_ratio <= 0.775 / 0.69


def test_fp8_cast_bytes_count_each_linear_input_and_output_gradient():
    m = c.ModelConfig(2, 1024, 8, ffn_hidden_size=4096)       # GPT MLP, MHA
    ins, outs = kernels.linear_widths(m, 1)
    assert (ins, outs) == (1024 + 1024 + 1024 + 4096, 3 * 1024 + 1024 + 4096 + 1024)
    assert kernels.fp8_cast_bytes(m, 1) == 4 * (ins + outs)
    assert kernels.fp8_cast_bytes(m, 2) < kernels.fp8_cast_bytes(m, 1)


def test_elementwise_bytes_split_over_tp_only_where_activations_are():
    m = c.ModelConfig(2, 1024, 8, ffn_hidden_size=4096)
    full = kernels.elementwise_bytes(m, 1, False)
    assert full == 40 * 1024 + 10 * 4096                      # norms and adds 40h, GeLU 10f
    assert kernels.elementwise_bytes(m, 2, True) == full / 2
    assert kernels.elementwise_bytes(m, 2, False) == 40 * 1024 + 10 * 4096 / 2


def test_nccl_ring_latency_is_ncclss_tuner_model():
    # NVIDIA/nccl src/graph/tuning.cc: ring, Simple: 8.4 us base, 3.4 us per NVLink step, 14 per net step
    assert nccl_ring_latency("all_reduce", 8) == pytest.approx(1e-6 * (8.4 + 14 * 3.4))
    assert nccl_ring_latency("all_gather", 16, 2) == pytest.approx(1e-6 * (8.4 + 14 * 3.4 + 1 * 14))
    assert nccl_ring_latency("all_reduce", 16, 2) == pytest.approx(1e-6 * (8.4 + 28 * 3.4 + 2 * 14))
    assert nccl_ring_latency("all_gather", 1) == 0.0
    # many small collectives: 512 ranks on 64 nodes pay ~2 ms per gather whatever the size
    assert nccl_ring_latency("all_gather", 512, 64) > 2e-3


def test_new_gpus_and_clusters():
    assert c.GPUS["B200-180GB"].generation == "B200" and c.CLUSTERS["dgx-b200"].intra_node_bandwidth == 900e9
    assert FITTED.efficiency("B200") == FITTED.efficiency("H100")
    gt = c.CLUSTERS["grand-teton-h100"]
    assert c.GPUS["H100-80GB"].peak_flops > gt.gpu.peak_flops > 835e12     # between SXM and NVL

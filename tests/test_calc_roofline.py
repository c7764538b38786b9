"""labkit.calc.roofline: intensities, the ridge, and the closed-form crossovers against the bytes
labkit.calc.comm counts (an independent path: the crossover formulas never call comm)."""
import math

import pytest

import labkit.calc as calc
from labkit.calc import roofline as rl

pytestmark = pytest.mark.quick
H100 = calc.GPUS["H100-80GB"]
GPT = calc.ModelConfig(24, 2048, 16, seq_length=1024, add_bias_linear=False, normalization="RMSNorm")


def test_ridge_and_roof():
    r = rl.ridge(H100.peak_flops, H100.hbm_bandwidth)
    assert r == pytest.approx(989e12 / 3.35e12)
    assert rl.attainable_flops(r / 2, H100.peak_flops, H100.hbm_bandwidth) == pytest.approx(H100.peak_flops / 2)
    assert rl.attainable_flops(10 * r, H100.peak_flops, H100.hbm_bandwidth) == H100.peak_flops
    with pytest.raises(ValueError):
        rl.ridge(0, 1)


def test_square_gemm_intensity_is_n_over_3_in_16_bit():
    for n in (64, 1024, 8192):
        assert rl.gemm_intensity(n, n, n) == pytest.approx(n / 3)
    # a skinny GEMM (one token): about 1 FLOP per byte, far left of every ridge
    assert rl.gemm_intensity(1, 4096, 4096) < 1.01


def test_layer_gemm_flops_equal_two_per_weight_per_token():
    for model in (GPT, calc.model("llama3-8b")):
        for tp in (1, 2, 4):
            b = 2
            ops = {o.name: o for o in rl.layer_ops(model, tp=tp, micro_batch_size=b)}
            T = model.seq_length * b
            gemm = sum(o.flops for o in ops.values() if o.kind == "gemm")
            weights = calc.layer_params(model, tp=tp)["dense"] - 2 * model.hidden_size   # minus 2 RMSNorms
            assert gemm == pytest.approx(2 * T * weights)
            assert rl.layer_weight_bytes(model, tp) == pytest.approx(2 * weights)


def test_op_time_and_bound():
    op = rl.gemm_op("x", 8192, 8192, 8192)
    assert rl.bound(op, H100.peak_flops, H100.hbm_bandwidth) == "compute"
    assert rl.op_time(op, H100.peak_flops, H100.hbm_bandwidth) == pytest.approx(op.flops / H100.peak_flops)
    thin = rl.gemm_op("y", 1, 8192, 8192)
    assert rl.bound(thin, H100.peak_flops, H100.hbm_bandwidth) == "memory"
    assert rl.op_time(thin, H100.peak_flops, H100.hbm_bandwidth) == pytest.approx(thin.bytes / H100.hbm_bandwidth)


def _ratio(model, layout, b=1, m=1):
    """comm time / compute time of the layout's one collective, on a link at 1/100 of H100's HBM."""
    (op,) = rl.comm_ops(model, layout, b, num_microbatches=m)
    W = 50e9
    return (op.bytes / W) / (op.flops / H100.peak_flops)


@pytest.mark.parametrize("n", [2, 3, 8])
def test_tp_crossover_hidden_size(n):
    h = rl.crossover("tp", n, H100.peak_flops, 50e9)
    model = calc.ModelConfig(2, int(round(h)), 1, seq_length=512, add_bias_linear=False)
    assert _ratio(model, {"tp": n}) == pytest.approx(h / model.hidden_size, rel=1e-9)


@pytest.mark.parametrize("axis,n", [("dp", 2), ("dp", 24), ("fsdp", 5), ("fsdp", 64)])
def test_dp_fsdp_crossover_tokens(axis, n):
    T = rl.crossover(axis, n, H100.peak_flops, 50e9)
    for m in (1, 3):     # accumulation: m microbatches of s tokens per step, bytes once per step (stage 0/3 at m=1)
        s = 256
        ratio = _ratio(GPT.with_(seq_length=s), {axis: n}, 1, m)
        if axis == "dp" or m == 1:
            assert ratio == pytest.approx(T / (m * s), rel=1e-9)
        else:            # ZeRO-3 gathers again for every microbatch: never better than m = 1
            assert ratio > T / (m * s)


@pytest.mark.parametrize("n", [2, 4, 6])
def test_cp_crossover_sequence(n):
    model = calc.model("llama3-8b")
    kv_ratio = model.query_groups / model.num_attention_heads
    s_star = rl.crossover("cp", n, H100.peak_flops, 50e9, kv_ratio=kv_ratio)
    s = 4096 * n
    assert _ratio(model.with_(seq_length=s), {"cp": n}) == pytest.approx(s_star / s, rel=1e-9)


@pytest.mark.parametrize("n", [2, 8])
def test_ep_crossover_ffn(n):
    model = calc.model("mixtral-8x7b")
    f_star = rl.crossover("ep", n, H100.peak_flops, 50e9, swiglu=True)
    assert _ratio(model, {"ep": n}) == pytest.approx(f_star / model.moe_ffn_hidden_size, rel=1e-9)


def test_crossover_rejects_bad_input():
    with pytest.raises(ValueError):
        rl.crossover("pp", 2, 1e15, 1e11)
    with pytest.raises(ValueError):
        rl.crossover("tp", 0, 1e15, 1e11)
    assert rl.crossover("dp", 1, 1e15, 1e11) == 0.0


def test_attention_is_compute_bound_and_the_norm_memory_bound():
    ops = {o.name: o for o in rl.layer_ops(calc.model("llama3-8b"))}
    r = rl.ridge(H100.peak_flops, H100.hbm_bandwidth)
    assert ops["attention"].intensity > r > ops["norm"].intensity
    assert ops["norm"].intensity == pytest.approx(1.0)
    assert math.isinf(rl.Op("z", "gemm", 1.0, 0.0).intensity)


def test_layout_links_follow_megatron_order():
    c = calc.CLUSTERS["dgx-h100"]
    links = rl.layout_links(c, {"tp": 8, "cp": 2, "dp": 4})
    assert links["tp"] == (c.intra_node_bandwidth, "NVLink")          # 8 consecutive ranks: one node
    assert links["cp"] == (c.inter_node_bandwidth / 8, "network")    # one member per node
    assert links["dp"][1] == "network" and "ep" not in links
    inside = rl.layout_links(c, {"tp": 2, "cp": 2, "dp": 2})
    assert {name for _, name in inside.values()} == {"NVLink"}       # 8 ranks: all in one node
    assert rl.layout_links(c, {"tp": 16})["tp"] == (c.link(16, 16)[0], "network")

"""Tier 1: labkit.calc's communication counts against their closed forms, and its refusals of
sizes that would come back as nan or negative bytes (issue 24, row 2 and "failing safely")."""
import math

import pytest

from labkit import calc
from labkit.calc import comm


@pytest.mark.parametrize("c", [1, 2, 4, 8])
@pytest.mark.parametrize("s, b, h_kv", [(4096, 1, 1600), (32768, 2, 512)])
def test_cp_ring_bytes_per_rank_are_12_c_minus_1_over_c_s_b_hkv_in_16_bit(c, s, b, h_kv):
    """Ring attention (p2p): K/V c-1 hops forward, K/V and dK/dV c-1 hops backward, each hop
    2 s/c b h_kv elements: 6 (c-1)/c s b h_kv elements = 12 (c-1)/c s b h_kv bytes in 16-bit."""
    sixteen_bit = calc.cp_layer_bytes(s, b, h_kv, c, bytes_per_element=2)
    assert sixteen_bit == {"send_recv": pytest.approx(12 * (c - 1) / c * s * b * h_kv, rel=1e-12)}
    elements = calc.cp_layer_bytes(s, b, h_kv, c, bytes_per_element=1)["send_recv"]
    assert elements == pytest.approx(6 * (c - 1) / c * s * b * h_kv, rel=1e-12)
    ag = calc.cp_layer_bytes(s, b, h_kv, c, bytes_per_element=2, cp_comm_type="all_gather")
    assert sum(ag.values()) == pytest.approx(sixteen_bit["send_recv"], rel=1e-12)  # the ring's bytes


@pytest.mark.parametrize("call, name", [
    (lambda: calc.ring_all_reduce_bytes(-100, 4), "n_bytes"),
    (lambda: calc.ring_all_reduce_bytes(float("nan"), 4), "n_bytes"),
    (lambda: calc.all_gather_bytes(float("inf"), 4), "n_bytes"),
    (lambda: calc.reduce_scatter_bytes(True, 4), "n_bytes"),
    (lambda: calc.all_to_all_bytes("8", 4), "n_bytes"),
    (lambda: calc.dp_step_bytes(-1, 4), "param_bytes"),
    (lambda: calc.dp_step_bytes(100, 4, 1, grad_bytes=float("nan")), "grad_bytes"),
    (lambda: calc.tp_layer_bytes(1024, -1, 64, 2), "micro_batch_size"),
    (lambda: calc.pp_step_bytes(1024, 1, float("nan"), 4, 2, 0), "hidden_size"),
    (lambda: calc.pp_step_bytes(1024, 1, 64, 4, 2, 0.5), "stage"),
    (lambda: calc.cp_layer_bytes(-4096, 1, 64, 2), "seq_length"),
    (lambda: calc.cp_layer_bytes(4096, 1, 64, 0), "cp"),
    (lambda: calc.ep_layer_bytes(1024, 1, 64, 2, moe_router_topk=-2), "moe_router_topk"),
    (lambda: comm.expert_tp_layer_bytes(1024, 1, 64, 0), "etp"),
    (lambda: comm.ep_routed_bytes(-5, 3, 64), "rows_to_others"),
    (lambda: comm.ep_allgather_layer_bytes(1024, 1, 64, float("nan"), 2), "num_experts"),
    (lambda: calc.alpha_beta_time(100, 0), "bandwidth"),
    (lambda: calc.alpha_beta_time(100, float("nan")), "bandwidth"),
    (lambda: calc.alpha_beta_time(100, 1e9, latency=-1e-6), "latency"),
    (lambda: calc.collective_time("all_reduce", -1, 4, 1e9), "n_bytes"),
    (lambda: calc.zero_memory_per_rank(float("nan"), 4, 1), "num_params"),
    (lambda: calc.zero_memory_per_rank(-10, 4, 1), "num_params"),
    (lambda: calc.activation_bytes_per_layer(-1024, 1, 64, 4), "seq_length"),
    (lambda: calc.activation_bytes_per_layer(1024, 1, 64, 4, tp=0), "tp"),
])
def test_nan_negative_or_non_numeric_sizes_are_refused_by_name(call, name):
    with pytest.raises(ValueError, match=rf"^{name} must be"):
        call()


def test_unknown_collective_is_a_value_error_listing_the_known_ones():
    with pytest.raises(ValueError, match=r"op must be one of \('all_reduce', 'all_gather', "
                                         r"'reduce_scatter', 'all_to_all'\), got 'bogus'"):
        calc.collective_time("bogus", 100, 4, 1e9)
    with pytest.raises(ValueError, match="op must be one of .*'send_recv'.*got 'bogus'"):
        comm.ring_steps("bogus", 4)


def test_valid_sizes_still_count_and_numpy_scalars_pass():
    np = pytest.importorskip("numpy")
    assert calc.ring_all_reduce_bytes(np.int64(100), 4) == 150.0
    assert calc.ring_all_reduce_bytes(0, 4) == 0.0
    assert math.isclose(calc.collective_time("all_gather", 400, 4, 100.0, 1.0), 3 + 3.0)


@pytest.mark.parametrize("gbs", [0, -8, 8.0, True, None])
def test_plan_refuses_a_global_batch_that_is_not_a_positive_integer(gbs):
    with pytest.raises(ValueError, match=r"global_batch_size must be a positive integer"):
        calc.plan(calc.model("gpt2-774m"), calc.cluster("dgx-h100"), gbs)


@pytest.mark.parametrize("headroom", [0, 1.5, float("nan")])
def test_plan_refuses_a_headroom_outside_0_1(headroom):
    with pytest.raises(ValueError, match=r"headroom must be in \(0, 1\]"):
        calc.plan(calc.model("gpt2-774m"), calc.cluster("dgx-h100"), 8, headroom=headroom)

"""Tier 1 (no processes): the single-device MoE layer (labkit/moe.py) against independent formulas.

* the layer's output is the mixture sum_e p[t, e] expert_e(x_t), written densely here (every
  expert on every token, then masked): no permutation, no top-k helper of labkit's;
* the router's probabilities follow Megatron's two orders (top-k then softmax; softmax then
  top-k with ``moe_router_pre_softmax``), computed here by sorting;
* the load-balancing loss is Switch's E * sum_e f_e P_e (Fedus et al. 2021, eq. 4) with f_e the
  fraction of token copies sent to e and P_e the mean router probability, per sequence for
  ``seq_aux_loss``; the z-loss is mean(logsumexp^2) (Zoph et al. 2022); their gradients join the
  backward scaled by ``aux_loss_scale`` while the forward output is unchanged;
* capacity ceil(T k / E * factor) per expert (Megatron's get_capacity, written out), the two drop
  policies, and padding to capacity changing nothing but the rows computed;
* GPTConfig.num_parameters and labkit.calc count the MoE model exactly; the MoE and EP rules are
  ValueErrors naming the numbers.
"""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch.testing import assert_close

from labkit import calc
from labkit.config import GPTConfig, TrainConfig
from labkit.model import GPT
from labkit import moe_stats
from labkit.moe import MoELayer, permute, unpermute

H, E, T_B, T_S = 16, 4, 2, 6   # hidden, experts, batch, sequence


def layer(**kw) -> MoELayer:
    cfg = GPTConfig(num_layers=1, hidden_size=H, num_attention_heads=2, seq_length=T_S,
                    num_experts=E, moe_ffn_hidden_size=24, **kw)
    torch.manual_seed(0)
    m = MoELayer(cfg).double()
    with torch.no_grad():
        for p in m.parameters():           # every weight and bias non-zero, so none hides a bug
            p.normal_(0, 0.5)
    moe_stats.attach(m)                    # the routers' statistics are kept only when attached
    return m


def x_in():
    return torch.randn(T_B, T_S, H, dtype=torch.float64, generator=torch.Generator().manual_seed(1))


def dense_mixture(m: MoELayer, x, pre_softmax: bool):
    """sum over the top-k experts of p * expert(x), every expert run on every token."""
    k = m.router.topk
    flat = x.reshape(-1, H)
    logits = flat @ m.router.weight.T
    order = logits.argsort(dim=-1, descending=True)[:, :k]              # top-k by sorting
    if pre_softmax:
        p = torch.softmax(logits, -1).gather(1, order)
    else:
        p = torch.softmax(logits.gather(1, order), -1)
    outs = torch.stack([F.linear(F.gelu(F.linear(flat, ex.linear_fc1.weight, ex.linear_fc1.bias)),
                                 ex.linear_fc2.weight, ex.linear_fc2.bias)
                        for ex in (m.experts.local_experts[str(e)] for e in range(E))], 1)  # [T, E, h]
    y = (outs.gather(1, order[..., None].expand(-1, -1, H)) * p[..., None]).sum(1)
    if m.shared_experts is not None:
        s = m.shared_experts
        y = y + s.linear_fc2(F.gelu(s.linear_fc1(flat)))
    return y.view_as(x)


@pytest.mark.parametrize("topk,pre_softmax,shared", [(1, False, None), (2, False, None), (2, True, 20),
                                                     (3, True, None)])
def test_layer_equals_the_dense_mixture(topk, pre_softmax, shared):
    m = layer(moe_router_topk=topk, moe_router_pre_softmax=pre_softmax,
              moe_shared_expert_intermediate_size=shared)
    x = x_in()
    assert_close(m(x), dense_mixture(m, x, pre_softmax), rtol=1e-12, atol=1e-12)


def test_top1_without_pre_softmax_gives_weight_one():
    """Megatron's order: softmax over the k chosen logits; with k = 1 the weight is 1 (the router
    learns only from the aux loss): the reason moe_router_pre_softmax exists."""
    m = layer(moe_router_topk=1)
    probs, routing_map = m.router(x_in().reshape(-1, H), (T_B, T_S))
    assert torch.equal(probs.sum(1), torch.ones(T_B * T_S, dtype=torch.float64))
    assert int(routing_map.sum()) == T_B * T_S


def switch_loss(scores, routing_map, k):
    """E * sum_e f_e P_e: f_e = copies routed to e / (T k), P_e = mean score of e."""
    T = scores.shape[0]
    f = routing_map.double().sum(0) / (T * k)
    return E * (f * scores.mean(0)).sum()


def test_aux_and_z_loss_values_and_gradients():
    coeff, zc, scale = 0.1, 0.01, 0.25
    m = layer(moe_aux_loss_coeff=coeff, moe_z_loss_coeff=zc)
    m.router.aux_loss_scale = scale
    x = x_in().reshape(-1, H).requires_grad_()
    probs, routing_map = m.router(x, (T_B, T_S))
    c = torch.randn(probs.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    (probs * c).sum().backward()
    g_x, g_w = x.grad.clone(), m.router.weight.grad.clone()
    # independent: the same output with the two losses added explicitly, times the scale
    x2 = x.detach().clone().requires_grad_()
    w = m.router.weight.detach().clone().requires_grad_()
    logits = x2 @ w.T
    top, idx = logits.sort(dim=-1, descending=True)
    p = torch.zeros_like(logits).scatter(1, idx[:, :2], torch.softmax(top[:, :2], -1))
    scores = torch.softmax(logits, -1)
    lb = switch_loss(scores, torch.zeros_like(logits).scatter(1, idx[:, :2], 1.0), 2)
    z = torch.logsumexp(logits, -1).square().mean()
    assert_close(probs.detach(), p.detach(), rtol=1e-13, atol=1e-13)       # forward unchanged
    ((p * c).sum() + scale * (coeff * lb + zc * z)).backward()
    assert_close(g_x, x2.grad, rtol=1e-12, atol=1e-13)
    assert_close(g_w, w.grad, rtol=1e-12, atol=1e-13)
    assert m.router.stats["load_balancing_loss"].item() == pytest.approx(lb.item(), rel=1e-12)
    assert m.router.stats["z_loss"].item() == pytest.approx(z.item(), rel=1e-12)


def test_seq_aux_loss_is_the_mean_of_per_sequence_losses():
    m = layer(moe_aux_loss_coeff=1.0, moe_router_load_balancing_type="seq_aux_loss")
    x = x_in()
    m.router(x.reshape(-1, H), (T_B, T_S))
    per_seq = []
    for b in range(T_B):
        logits = x[b] @ m.router.weight.T
        top = torch.zeros_like(logits).scatter(1, logits.topk(2, -1).indices, 1.0)
        per_seq.append(switch_loss(torch.softmax(logits, -1), top, 2))
    assert m.router.stats["load_balancing_loss"].item() == pytest.approx(sum(per_seq).item() / T_B, rel=1e-12)


def test_balanced_router_has_aux_loss_one():
    """Uniform scores and equal counts: E * sum_e (1/E)(1/E) = 1, Switch's minimum."""
    from labkit.moe import switch_load_balancing_loss
    T, k = 8, 2
    scores = torch.full((T, E), 1 / E, dtype=torch.float64)
    counts = torch.full((E,), T * k / E, dtype=torch.float64)
    assert switch_load_balancing_loss(scores, counts, T, k, E, 1.0).item() == pytest.approx(1.0)


@pytest.mark.parametrize("policy", ["probs", "position"])
@pytest.mark.parametrize("factor", [0.5, 1.0])
def test_capacity_and_drop_policy(policy, factor):
    m = layer(moe_expert_capacity_factor=factor, moe_token_drop_policy=policy)
    x = x_in().reshape(-1, H)
    T = x.shape[0]
    logits = x @ m.router.weight.T
    full = torch.zeros_like(logits, dtype=torch.bool).scatter(1, logits.topk(2, -1).indices, True)
    p_full = torch.zeros_like(logits).scatter(1, logits.topk(2, -1).indices, torch.softmax(logits.topk(2, -1).values, -1))
    probs, kept = m.router(x, (T_B, T_S))
    cap = math.ceil(T * 2 / E * factor)                     # Megatron's get_capacity, written out
    assert m.router.capacity == cap
    assert bool((kept <= full).all()) and bool((kept.sum(0) <= cap).all())
    assert torch.equal(probs, p_full * kept)
    megatron_order = [(t % T_S) * T_B + t // T_S for t in range(T)]       # [s, b] flattening
    for e in range(E):
        routed = full[:, e].nonzero().flatten().tolist()
        assert int(kept[:, e].sum()) == min(len(routed), cap)            # drops only over capacity
        if policy == "probs":
            expect = sorted(routed, key=lambda t: -p_full[t, e].item())[:cap]
        else:
            expect = sorted(routed, key=lambda t: megatron_order[t])[:cap]
        assert sorted(kept[:, e].nonzero().flatten().tolist()) == sorted(expect)
    assert m.router.stats["dropped"].item() == int(full.sum() - kept.sum())
    if factor == 0.5:
        assert m.router.stats["dropped"].item() > 0                     # the test can see drops


@pytest.mark.parametrize("policy", ["probs", "position"])
def test_capacity_per_routing_group_drops_each_slice_of_positions_on_its_own(policy):
    """``routing_groups`` g (what a tp rank under SP routes: s/g positions of every sequence): the
    drops equal g routers run on the g slices separately, each with the capacity of its b * s/g
    tokens; and they differ from one router over all positions (the case is not vacuous)."""
    g = 2
    m = layer(moe_expert_capacity_factor=0.5, moe_token_drop_policy=policy)
    m.router.routing_groups = g
    x = x_in()                                                           # [b, s, h]
    probs, kept = m.router(x.reshape(-1, H), (T_B, T_S))
    one = layer(moe_expert_capacity_factor=0.5, moe_token_drop_policy=policy)
    one.load_state_dict(m.state_dict())
    want_p, want_k = [], []
    for part in x.chunk(g, dim=1):                                       # [b, s/g, h]
        p, k = one.router(part.reshape(-1, H), (T_B, T_S // g))
        want_p.append(p.view(T_B, T_S // g, E))
        want_k.append(k.view(T_B, T_S // g, E))
    assert torch.equal(kept.view(T_B, T_S, E), torch.cat(want_k, dim=1))
    assert torch.equal(probs.view(T_B, T_S, E), torch.cat(want_p, dim=1))
    assert m.router.capacity == g * math.ceil(T_B * T_S // g * 2 / E * 0.5)
    _, whole = one.router(x.reshape(-1, H), (T_B, T_S))
    assert not torch.equal(kept, whole)


def test_padding_to_capacity_changes_only_the_rows():
    m = layer(moe_expert_capacity_factor=1.5)
    pad = layer(moe_expert_capacity_factor=1.5, moe_pad_expert_input_to_capacity=True)
    pad.load_state_dict(m.state_dict())
    x = x_in()
    assert_close(pad(x), m(x), rtol=1e-13, atol=1e-13)
    _, routing_map = m.router(x.reshape(-1, H), (T_B, T_S))
    token, counts = permute(routing_map, capacity=m.router.capacity)
    assert token.numel() == E * m.router.capacity and counts.tolist() == [m.router.capacity] * E


def test_permutation_sorts_by_expert_and_its_inverse_restores_the_order():
    x = x_in().reshape(-1, H)
    routing_map = torch.zeros(x.shape[0], E, dtype=torch.bool)
    routing_map[torch.arange(x.shape[0]), torch.arange(x.shape[0]) % E] = True
    routing_map[torch.arange(x.shape[0]), (torch.arange(x.shape[0]) * 3 + 1) % E] = True
    token, counts = permute(routing_map)
    experts = torch.repeat_interleave(torch.arange(E), counts)
    assert bool(routing_map[token, experts].all())                        # row i: token -> its expert
    assert torch.equal(experts, experts.sort().values)                     # grouped by expert
    back = unpermute(x[token], token, torch.ones(token.numel(), dtype=x.dtype), x.shape[0])
    assert_close(back, x * routing_map.sum(1, keepdim=True), rtol=0, atol=0)


@pytest.mark.parametrize("kw", [dict(num_experts=4), dict(num_experts=8, moe_router_topk=1, moe_layer_freq=2),
                                dict(num_experts=4, moe_layer_freq=[0, 1, 1], moe_ffn_hidden_size=48,
                                     moe_shared_expert_intermediate_size=40)])
def test_parameter_counts_are_exact(kw):
    layers = 3
    cfg = TrainConfig(num_layers=layers, hidden_size=32, num_attention_heads=4, seq_length=16, **kw)
    model = GPT(cfg.model_config())
    n = sum(p.numel() for p in model.parameters())
    assert cfg.model_config().num_parameters() == n
    assert calc.total_params(cfg.megatron_view(1)[0]) == n              # the calculators' count


@pytest.mark.parametrize("world,kw,words", [
    (2, dict(expert_model_parallel_size=2), ["needs num_experts", "EP=2"]),
    (4, dict(num_experts=6, expert_model_parallel_size=4), ["num_experts divisible by EP", "6 % 4"]),
    (4, dict(num_experts=8, expert_model_parallel_size=8), ["ETP*EP*PP", "4 % (1*8*1)"]),
    (4, dict(num_experts=4, expert_model_parallel_size=2, tensor_model_parallel_size=2),
     ["needs sequence_parallel", "tensor_model_parallel_size 2"]),
    (8, dict(num_experts=8, expert_model_parallel_size=8, tensor_model_parallel_size=2,
             sequence_parallel=True), ["ETP*EP*PP", "8 % (2*8*1)", "DP*CP = 4*1"]),
    (2, dict(num_experts=4, moe_token_dispatcher_type="flex"), ["moe_token_dispatcher_type"]),
    (1, dict(num_experts=4, moe_pad_expert_input_to_capacity=True), ["moe_expert_capacity_factor must be set"]),
    (1, dict(num_experts=4, moe_router_load_balancing_type="sinkhorn"), ["moe_router_load_balancing_type"]),
    (1, dict(num_experts=4, moe_router_topk=5), ["moe_router_topk <= num_experts", "5 > 4"]),
    (1, dict(num_experts=4, moe_layer_freq=[1, 0, 1]), ["moe_layer_freq pattern", "2 layers"]),
])
def test_moe_rules_name_the_numbers(world, kw, words):
    with pytest.raises(ValueError) as err:
        TrainConfig(num_layers=2, hidden_size=32, num_attention_heads=4, seq_length=16, **kw).validate(world)
    for w in words:
        assert w in str(err.value), (w, str(err.value))

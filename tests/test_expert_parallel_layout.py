"""Tier 1 (no processes): the expert grid, gradient ownership and the MoE calculators.

* Topology's expert groups (ep, edp, etp, etp x ep) and its dense groups equal what Megatron-LM's
  ``RankGenerator`` builds (``megatron/core/parallel_state.py`` @ d98e8a64: the dense generator
  with order tp-cp-ep-dp-pp and ep = 1, the expert generator with tp = etp, cp = 1 and
  dp = world / (etp*ep*pp)); ``generate_masked_orthogonal_rank_groups`` is transcribed below,
  an independent construction of the same groups.
* the shard plan's one rule (``ParamShard.owned_ranges``) on the expert-parallel plan's entries
  counts every value of every expert exactly once over the world, with and without ZeRO, with
  etp 1 and etp = tp.
* labkit.calc: experts sharded over EP x ETP and their optimizer states over expert-DP (memory),
  Megatron's expert grid rule, the presets' parameter counts, the planner searching EP.
"""
from __future__ import annotations

import itertools

import pytest

from labkit import calc
from labkit.topology import Topology


# -- Megatron's RankGenerator, transcribed (parallel_state.py @ d98e8a64) ------------------------
def _prefix_product(a, init=1):
    r = [init]
    for v in a:
        init *= v
        r.append(init)
    return r


def megatron_groups(world_size, parallel_size, mask):
    """generate_masked_orthogonal_rank_groups."""
    def decompose(index, shape):
        stride = _prefix_product(shape)
        return [(index // d) % s for s, d in zip(shape, stride)]
    masked_shape = [s for s, m in zip(parallel_size, mask) if m]
    unmasked_shape = [s for s, m in zip(parallel_size, mask) if not m]
    stride = _prefix_product(parallel_size)
    masked_stride = [d for d, m in zip(stride, mask) if m]
    unmasked_stride = [d for d, m in zip(stride, mask) if not m]
    group_size = _prefix_product(masked_shape)[-1]
    out = []
    for g in range(world_size // group_size):
        gi = decompose(g, unmasked_shape)
        out.append([sum(x * y for x, y in zip(decompose(r, masked_shape), masked_stride))
                    + sum(x * y for x, y in zip(gi, unmasked_stride)) for r in range(group_size)])
    return out


def rank_generator(tp, ep, dp, pp, cp, token):
    """RankGenerator(tp, ep, dp, pp, cp, order="tp-cp-ep-dp-pp").get_ranks(token)."""
    order, sizes = ["tp", "cp", "ep", "dp", "pp"], {"tp": tp, "cp": cp, "ep": ep, "dp": dp, "pp": pp}
    names = token.split("-")
    return megatron_groups(tp * cp * ep * dp * pp, [sizes[o] for o in order], [o in names for o in order])


LAYOUTS = [dict(world_size=8, tp=2, ep=2), dict(world_size=8, tp=2, ep=4, etp=1),
           dict(world_size=16, tp=2, cp=2, pp=2, ep=2), dict(world_size=16, tp=2, pp=2, ep=4, etp=1),
           dict(world_size=8, cp=2, ep=4), dict(world_size=4, tp=2, ep=2, etp=1),
           dict(world_size=24, tp=2, pp=3, ep=2)]


@pytest.mark.parametrize("kw", LAYOUTS)
def test_groups_equal_megatron_rank_generator(kw):
    t = Topology(**kw)
    dense = dict(tp=t.tp, ep=1, dp=t.dp, pp=t.pp, cp=t.cp)
    expert = dict(tp=t.etp, ep=t.ep, dp=t.edp, pp=t.pp, cp=1)
    sort = lambda groups: sorted(sorted(g) for g in groups)  # noqa: E731
    for axis, token in (("tp", "tp"), ("cp", "cp"), ("dp", "dp"), ("pp", "pp"), ("dp_cp", "cp-dp")):
        assert t.groups(axis) == sort(rank_generator(**dense, token=token)), axis
    for axis, token in (("ep", "ep"), ("edp", "dp"), ("etp", "tp"), ("etp_ep", "tp-ep"), ("pp", "pp")):
        assert t.groups(axis) == sort(rank_generator(**expert, token=token)), axis
    for r in range(t.world_size):           # coordinates index the groups
        c = t.expert_coords(r)
        assert t.group_of("ep", r)[c["ep"]] == r and t.group_of("edp", r)[c["edp"]] == r
        assert t.coords(r)["ep"] == c["ep"]


def test_etp_equal_tp_carves_ep_out_of_dp_x_cp():
    t = Topology(16, tp=2, cp=2, ep=4)          # dp 4 x cp 2 = 8 ranks per tp rank; ep 4 of them
    for g in t.groups("ep"):
        assert len({t.coords(r)["tp"] for r in g}) == 1        # one tp rank: ep spans cp, then dp
        assert {t.coords(r)["cp"] for r in g} == {0, 1}
    with pytest.raises(ValueError, match=r"etp\*ep\*pp = 2\*3\*1.*data-parallel size 4 x "
                                         r"context-parallel size 1 is not divisible by ep 3"):
        Topology(8, tp=2, ep=3)


def expert_entries(t: Topology, coords: dict) -> dict:
    """{name: ParamShard} of one routed expert on the rank at ``coords``, as the expert-parallel plan
    makes them (``apply_expert_parallel``: averaged over edp, then ``cut_expert`` over etp; a
    stand-in etp group: no processes)."""
    from types import SimpleNamespace

    from labkit import shard_plan as sp
    from labkit.expert_parallel.plan import cut_expert
    from labkit.model import GPTConfig
    from labkit.modules import MLP
    mlp = MLP(GPTConfig(num_layers=1, hidden_size=8, num_attention_heads=2, seq_length=4, ffn_hidden_size=8),
              expert=True)
    entries = {n: sp.ParamShard(n, tuple(p.shape)).with_(dp="edp", dp_index=coords["edp"], expert=True)
               for n, p in mlp.named_parameters()}
    return cut_expert(mlp, SimpleNamespace(size=t.etp, rank=coords["etp"]), entries) if t.etp > 1 else entries


@pytest.mark.parametrize("kw", [dict(world_size=8, tp=2, ep=2), dict(world_size=8, tp=2, ep=4, etp=1),
                                dict(world_size=8, pp=2, ep=2)])
@pytest.mark.parametrize("zero", [False, True])
def test_the_plan_counts_every_expert_value_once(kw, zero):
    t = Topology(**kw)
    E, edp_shards = 8, t.edp if zero else 1
    counted, cut = {}, {}
    for r in range(t.world_size):
        coords = {**t.coords(r), **t.expert_coords(r)}
        n_local = E // t.ep
        entries = expert_entries(t, coords)
        for e in range(coords["ep"] * n_local, (coords["ep"] + 1) * n_local):
            for name, entry in entries.items():
                cut[name] = entry.cut == "etp"
                if entry.owned_ranges(dp_sharded=zero):
                    part = (coords["etp"] if cut[name] else 0, coords["edp"] if zero else 0)
                    key = (coords["pp"], e, name, part)
                    counted[key] = counted.get(key, 0) + 1
    assert set(cut) == {"linear_fc1.weight", "linear_fc1.bias", "linear_fc2.weight", "linear_fc2.bias"}
    assert any(cut.values()) == (t.etp > 1) and not cut["linear_fc2.bias"]   # a bias etp rank 0 adds
    for pp, e, name in itertools.product(range(t.pp), range(E), cut):
        found = [v for (p_, e_, n_, _), v in counted.items() if (p_, e_, n_) == (pp, e, name)]
        assert found == [1] * ((t.etp if cut[name] else 1) * edp_shards), (pp, e, name, found)


def test_memory_shards_experts_over_ep_x_etp_and_optimizer_over_expert_dp():
    model = calc.ModelConfig(2, 64, 4, seq_length=32, vocab_size=256, num_experts=8, moe_ffn_hidden_size=128)
    h, f = 64, 128
    per_expert = h * f + f + f * h + h                                  # fc1 + fc2 with biases
    for tp, ep, etp in ((1, 2, 1), (2, 2, 2), (2, 4, 1)):
        par = calc.ParallelConfig(16, tp, expert_model_parallel_size=ep, expert_tensor_parallel_size=etp,
                                  sequence_parallel=tp > 1, use_distributed_optimizer=True)
        c = calc.stage_params(model, par, 0)
        cut = (h * f + f) // etp + f * h // etp + h                     # fc1 rows + fc2 cols + fc2 bias
        assert c["expert"] == 2 * (8 // ep) * cut
        assert par.edp == 16 // (etp * ep)
        row = calc.memory_per_stage(model, par, calc.FP32)[0]
        dense = calc.zero_memory_per_rank(c["dense"], par.dp, 1)
        assert row["optimizer"] == dense["optimizer"] + 8 * -(-c["expert"] // par.edp)
        assert row["params"] == 4 * (c["dense"] + c["expert"])
        assert c["expert"] * ep * etp == 2 * 8 * per_expert + 2 * 8 * h * (etp - 1)   # fc2 bias whole


def test_expert_grid_rule_is_megatrons():
    model = calc.ModelConfig(2, 64, 4, num_experts=8)
    calc.validate(model, calc.ParallelConfig(8, 2, expert_model_parallel_size=8, expert_tensor_parallel_size=1))
    with pytest.raises(ValueError, match=r"world_size divisible by ETP\*EP\*PP.*8 % \(2\*8\*1\)"):
        calc.validate(model, calc.ParallelConfig(8, 2, expert_model_parallel_size=8))


def test_presets_match_published_counts_and_the_planner_searches_ep():
    ds = calc.model("deepseek-moe-16b")
    assert ds.moe_layers()[:2] == [0, 1] and sum(ds.moe_layers()) == 27      # first layer dense
    assert round(calc.total_params(ds) / 1e9, 1) == 16.4                      # Dai et al. 2024, Table
    assert round(calc.active_params(ds) / 1e9, 1) == 2.8
    result = calc.plan(calc.model("mixtral-8x7b"), calc.cluster("dgx-h100", 4), 256,
                       micro_batch_sizes=(1,), recompute=("full",))
    assert {r["ep"] for r in result["ranked"]} > {1}                           # EP is searched

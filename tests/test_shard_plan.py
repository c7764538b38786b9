"""Tier 1 (no processes): the shard plan's cuts, ownership and reassembly; stage placement; RoPE;
measurement that is off unless attached. Issue "labkit v3 and the Llama family".
"""
from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from labkit import shard_plan as sp
from labkit.pipeline_parallel import placement as pl
from labkit.pipeline_parallel import schedules as S
from labkit.pipeline_parallel.simulate import simulate


def test_swiglu_fc1_gives_rank_r_its_gate_and_up_slices():
    # fc1 = [gate; up], ffn 8 each: 2 ranks -> rank 1 holds gate[4:8] and up[4:8] (rows 4:8, 12:16)
    assert [(b.start, b.stop) for b in sp.stacked(16, 2, 2, 1)] == [(4, 8), (12, 16)]
    assert [(b.start, b.stop) for b in sp.contiguous(16, 2, 1)] == [(8, 16)]      # the trap it avoids


@pytest.mark.parametrize("heads, groups, t", [(8, 2, 2), (8, 2, 4), (8, 8, 4), (4, 1, 4), (8, 4, 2)])
def test_qkv_blocks_cover_every_row_once_among_owners(heads, groups, t):
    """Megatron's rows [q.. | k | v] per group: the owned blocks of the t ranks tile the dense rows
    exactly once; with g < t the K/V block is held by t/g ranks, summed over "tp_kv", owned by one."""
    d = 2
    rows = (heads + 2 * groups) * d
    count = torch.zeros(rows, dtype=torch.long)
    for r in range(t):
        blocks = sp.qkv(heads, groups, d, t, r)
        assert sum(b.size for b in blocks) == (heads // t + 2 * max(1, groups // t)) * d  # local rows
        kinds = [b.sums for b in blocks]
        assert kinds == ([(), ("tp_kv",)] if groups < t else [()])
        for b in blocks:
            if b.owner:
                count[b.start:b.stop] += 1
    assert torch.equal(count, torch.ones(rows, dtype=torch.long))


def test_qkv_rank_holds_its_query_heads_and_its_group_kv():
    # 8 heads, 2 groups, head_dim 1: rows [q0..q3 k0 v0 | q4..q7 k1 v1]; tp 4: rank 3 -> q6 q7 k1 v1
    blocks = sp.qkv(8, 2, 1, 4, 3)
    assert [(b.start, b.stop) for b in blocks] == [(8, 10), (10, 12)]
    assert blocks[1].replicas == (("tp_kv", 1, 2),) and not blocks[1].owner


def test_assemble_then_cut_reshards_between_layouts():
    """A checkpoint under one layout loads under another: assemble every rank's pieces, then cut
    by the new plan. Here a fused QKV [(8 + 2*2) x 2 rows, 5] from TP 2 to TP 4 (replicated K/V)."""
    dense = torch.arange(24 * 5, dtype=torch.float64).view(24, 5)
    entry = sp.ParamShard("qkv", (24, 5))
    old = [entry.cut_along(0, sp.qkv(8, 2, 2, 2, r), "tp") for r in range(2)]
    asm = sp.Assembler()
    for e in old:
        asm.add(e, sp.cut(dense, e))
    back = asm.result()["qkv"]
    assert torch.equal(back, dense)
    for r in range(4):
        new = entry.cut_along(0, sp.qkv(8, 2, 2, 4, r), "tp")
        piece = sp.cut(back, new)
        assert piece.shape == new.local_shape == (8, 5)            # 2 query heads + k + v, head_dim 2
    with pytest.raises(ValueError, match="no rank holds indices"):
        sp.assemble((24, 5), 0, [(0, 12, dense[:12])])


def test_ranges_sums_tags_and_ownership():
    e = sp.ParamShard("norm", (6,)).with_replicas("tp", 1, 2, summed=True)
    assert e.sum_ranges("tp") == [(0, 6)] and e.owned_ranges(dp_sharded=False) == []   # tp rank 1
    assert e.tags() == {"tensor_model_parallel": False, "sequence_parallel": True}
    q = sp.ParamShard("qkv", (12, 3)).cut_along(0, sp.qkv(4, 2, 1, 4, 1), "tp")        # rows 1, 4:6
    assert q.sum_ranges("tp_kv") == [(3, 9)] and q.owned_ranges(False) == [(0, 3)]
    assert q.with_(dp_index=1).owned_ranges(False) == [] and q.with_(dp_index=1).owned_ranges(True) == [(0, 3)]
    copy = sp.ParamShard("embedding.word_embeddings.weight", (8, 2)).with_replicas("embd", 1, 2, summed=True)
    assert copy.tags() == {"tensor_model_parallel": False, "shared_embedding": True, "shared": True}
    assert copy.owned_ranges(False) == [] and copy.with_replicas("tp", 0, 2).owned_ranges(False) == []
    first = sp.ParamShard("embedding.word_embeddings.weight", (8, 2)).with_replicas("embd", 0, 2, summed=True)
    assert first.owned_ranges(False) == [(0, 16)]          # the first stage's copy counts the tied weight
    assert sp.ShardPlan({"a": q, "b": e, "c": copy}).sum_axes() == ["tp", "tp_kv", "embd"]


# -- stage placement: one owner ---------------------------------------------------------------------
@pytest.mark.parametrize("placement, v", [("loop", 1), ("loop", 3), ("v", 2)])
def test_placement_is_a_bijection_and_its_inverse(placement, v):
    p = 4
    stages = [pl.stage_of(r, c, p, v, placement) for r in range(p) for c in range(v)]
    assert sorted(stages) == list(range(p * v))
    for r in range(p):
        for c in range(v):
            assert pl.holder(pl.stage_of(r, c, p, v, placement), p, v, placement) == (r, c)
    if placement == "v":   # the V: the last stage sits on the first rank
        assert pl.holder(p * v - 1, p, v, "v") == (0, 1)


def test_loop_placement_is_megatrons_and_calc_agrees():
    from labkit import calc
    assert pl.rank_layers(8, 1, 2, 2) == [2, 3, 6, 7]                    # stages 1 and 3 of 4
    model = calc.ModelConfig(num_layers=8, hidden_size=64, num_attention_heads=4)
    par = calc.ParallelConfig(world_size=2, pipeline_model_parallel_size=2, num_layers_per_virtual_pipeline_stage=2)
    from labkit.calc.params import stage_layers
    assert stage_layers(model, par, 1) == [2, 3, 6, 7]


def test_dependencies_follow_the_placement():
    """Under the V placement (p = 2: rank 0 holds stages 0 and 3, rank 1 stages 1 and 2) the
    forward of rank 0's chunk 1 (stage 3) waits on stage 2, which is rank 1's chunk 1."""
    sched = [[S.Action("F", 0, 0), S.Action("F", 0, 1), S.Action("B", 0, 1), S.Action("B", 0, 0)],
             [S.Action("F", 0, 0), S.Action("F", 0, 1), S.Action("B", 0, 1), S.Action("B", 0, 0)]]
    deps = S.dependencies(0, S.Action("F", 0, 1), 2, 2, "v")
    assert deps == [(1, S.Action("F", 0, 1))]                      # stage 3 needs stage 2 (rank 1)
    ev = {(e.rank, str(e.action)): e for e in simulate(sched, placement="v").timeline}
    assert ev[(0, "F0.1")].start >= ev[(1, "F0.1")].end               # the simulator asks the placement
    ev = {(e.rank, str(e.action)): e for e in simulate(sched).timeline}
    assert ev[(0, "F0.1")].start < ev[(1, "F0.1")].end                # loop: stage 2 is rank 0's


def test_train_config_names_the_schedule():
    from labkit.config import TrainConfig
    assert TrainConfig().schedule_name() == "1f1b"
    cfg = TrainConfig(num_layers=4, pipeline_model_parallel_size=2, num_layers_per_virtual_pipeline_stage=1)
    assert cfg.schedule_name() == "interleaved_1f1b"
    with pytest.raises(ValueError, match="pipeline_schedule 'gpipe' runs 1 model chunk per rank"):
        TrainConfig(num_layers=4, pipeline_model_parallel_size=2, num_layers_per_virtual_pipeline_stage=1,
                    global_batch_size=4, pipeline_schedule="gpipe").validate(2)


# -- the model's roles and RoPE -----------------------------------------------------------------------
def test_rope_equals_complex_rotation_at_each_position():
    """RoPE as Su et al. write it: channel pair (i, i + d/2) as one complex number times
    exp(1j * position * base^(-2i/d)) (Megatron's non-interleaved layout)."""
    from labkit.modules import RotaryEmbedding
    torch.manual_seed(0)
    b, n, s, d, base = 2, 3, 5, 8, 500000
    q, k = torch.randn(b, n, s, d, dtype=torch.float64), torch.randn(b, 1, s, d, dtype=torch.float64)
    pos = torch.tensor([3, 4, 9, 10, 11])                          # a CP rank's global positions
    got_q, got_k = RotaryEmbedding(d, base)(q, k, pos)
    theta = pos[:, None].double() * base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    for x, got in ((q, got_q), (k, got_k)):
        z = torch.complex(x[..., :d // 2], x[..., d // 2:]) * torch.polar(torch.ones_like(theta), theta)
        assert_close(got, torch.cat([z.real, z.imag], dim=-1), rtol=1e-13, atol=1e-13)


def test_roles_not_classes():
    from labkit.model import GPT, preset
    from labkit.modules import roles
    model = GPT(preset("llama3-tiny"))
    got = roles(model)
    norms = [n for n, r in got.items() if r == "norm"]
    assert len(norms) == 2 * 4 + 1                                     # 2 per layer + the final one
    assert {type(model.get_submodule(n)).__name__ for n in norms} == {"RMSNorm"}
    assert got["decoder.layers.0.mlp.linear_fc1"] == "fc1" and got["output_layer"] == "output"


def test_moe_statistics_are_kept_only_when_attached():
    from labkit import moe_stats
    from labkit.model import GPT, preset
    from labkit.moe import moe_layers
    model = GPT(preset("mixtral-tiny"))
    tokens = torch.randint(0, 256, (2, 16))
    model(tokens, tokens)
    assert all(layer.router.stats is None for layer in moe_layers(model))   # nobody measures
    moe_stats.attach(model)
    model(tokens, tokens)
    assert moe_stats.stats_table(model, 2, 4)[:, :4].sum() == 2 * 2 * 16 * 2   # layers x tokens x top-2


def test_even_shard_is_what_a_dtensor_shard_can_express():
    whole = sp.ParamShard("w", (8, 4))
    assert whole.even_shard() is None                                              # replicated
    assert whole.cut_along(1, sp.contiguous(4, 2, 1), "tp").even_shard() == (1, 1)  # row-parallel
    assert whole.cut_along(0, sp.stacked(8, 2, 2, 1), "tp").even_shard() is None   # [gate_r; up_r]


def test_llama_family_figures_are_legible_on_a_phone():
    from labkit.figures import llama_family as F
    from labkit.figures import MIN_LABEL_PX, smallest_label_px, svg
    for fig in (F.swiglu_cut(), F.gqa_on_tp(), F.rope_positions_cp()):
        assert smallest_label_px(svg(fig)) >= MIN_LABEL_PX


def test_an_engine_without_a_shard_plan_fails_when_made_not_later():
    """Issue 35: ``Engine(plan=None)`` used to crash inside the first step's gradient finish."""
    from labkit.parallelize import Engine
    from labkit.config import TrainConfig
    with pytest.raises(TypeError, match="needs the ShardPlan"):
        Engine(None, None, {}, {}, TrainConfig(), None)

"""Tier 1 (no processes): context parallelism's local math, split, byte formulas and rules.

Issue "Context parallelism". The merge and the block backward are checked against plain softmax
attention and autograd on the whole sequence (float64: only the order of sums differs, 1e-12);
the ring is simulated in one process (c ranks in a for-loop, K/V blocks in ring order, dK/dV sent
back to their owners); planted bugs (a merge without the max subtraction, chunks stored in the
wrong order) must be caught by the same comparisons.
"""
from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

from labkit.context_parallel import blockwise, merge, sharding
from labkit.calc.comm import cp_attention_bytes, cp_layer_bytes

TOL = dict(rtol=1e-12, atol=1e-12)
gen = torch.Generator().manual_seed(0)


def rand(*shape):
    return torch.randn(*shape, generator=gen, dtype=torch.float64)


def dense(q, k, v, causal=True):
    """softmax(q k^T / sqrt(d) + mask) v over the whole sequence, and its log-sum-exp."""
    x = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if causal:
        x = x.masked_fill(torch.ones(x.shape[-2:], dtype=torch.bool).triu(1), float("-inf"))
    return torch.softmax(x, -1) @ v, torch.logsumexp(x, -1)


# ---------------------------------------------------------------------------------------- merge
@pytest.mark.parametrize("scale", [1.0, 1000.0])
def test_merging_blocks_in_any_order_equals_softmax_over_all_keys(scale):
    q, k, v = rand(2, 3, 5, 8) * scale, rand(2, 3, 11, 8), rand(2, 3, 11, 8)
    want, want_lse = dense(q, k, v, causal=False)
    cuts = [(0, 4), (4, 5), (5, 11)]
    parts = [merge.block_attention(q, k[..., a:b, :], v[..., a:b, :]) for a, b in cuts]
    for order in ([0, 1, 2], [2, 0, 1], [1, 2, 0]):
        out, lse = parts[order[0]]
        for i in order[1:]:
            out, lse = merge.merge_partials(out, lse, *parts[i])
        assert_close(out, want, **TOL)
        assert_close(lse, want_lse, rtol=1e-12, atol=1e-12 * scale)


def test_a_fully_masked_block_changes_nothing_and_empty_rows_stay_empty():
    q, k, v = rand(1, 2, 4, 8), rand(1, 2, 6, 8), rand(1, 2, 6, 8)
    a = merge.block_attention(q, k[..., :3, :], v[..., :3, :])
    hidden = merge.block_attention(q, k[..., 3:, :], v[..., 3:, :], torch.ones(4, 3, dtype=torch.bool))
    assert torch.isneginf(hidden[1]).all() and (hidden[0] == 0).all()
    for out, lse in (merge.merge_partials(*a, *hidden), merge.merge_partials(*hidden, *a)):
        assert_close(out, a[0], rtol=0, atol=0)
        assert_close(lse, a[1], rtol=0, atol=0)
    row = torch.zeros(4, 3, dtype=torch.bool)
    row[2] = True                                          # query 2 sees no key in either block
    out, lse = merge.merge_partials(*merge.block_attention(q, k[..., :3, :], v[..., :3, :], row),
                                    *merge.block_attention(q, k[..., 3:, :], v[..., 3:, :], row))
    assert not torch.isnan(out).any() and (out[:, :, 2] == 0).all() and torch.isneginf(lse[:, :, 2]).all()
    x = torch.cat([q @ k.transpose(-2, -1)], -1) / math.sqrt(8)
    x[..., 2, :] = float("-inf")
    keep = [0, 1, 3]
    assert_close(out[:, :, keep], (torch.softmax(x, -1) @ v)[:, :, keep], **TOL)


def naive_merge(out_a, lse_a, out_b, lse_b):
    """A planted bug: the textbook formula without subtracting the max first."""
    total = torch.exp(lse_a) + torch.exp(lse_b)
    return ((torch.exp(lse_a) / total)[..., None] * out_a + (torch.exp(lse_b) / total)[..., None] * out_b,
            torch.log(total))


def test_planted_bug_merge_without_max_subtraction_is_caught():
    q, k, v = rand(1, 2, 4, 8), rand(1, 2, 8, 8), rand(1, 2, 8, 8)
    for scale, caught in ((1.0, False), (1000.0, True)):   # fine at small scores, wrong at large ones
        qs = q * scale
        out, lse = naive_merge(*merge.block_attention(qs, k[..., :4, :], v[..., :4, :]),
                               *merge.block_attention(qs, k[..., 4:, :], v[..., 4:, :]))
        want = dense(qs, k, v, causal=False)[0]
        assert torch.allclose(out, want, **TOL) is not caught


def test_block_backward_summed_over_blocks_equals_autograd_on_dense_attention():
    q, k, v, dout = rand(2, 2, 8, 4), rand(2, 2, 8, 4), rand(2, 2, 8, 4), rand(2, 2, 8, 4)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    dense(*leaves)[0].backward(dout)
    blocks = [(0, 3, "past"), (3, 8, "diag-ish")]
    causal = torch.ones(8, 8, dtype=torch.bool).triu(1)
    out, lse = None, None
    for a, b, _ in blocks:
        part = merge.block_attention(q, k[..., a:b, :], v[..., a:b, :], causal[:, a:b])
        out, lse = part if out is None else merge.merge_partials(out, lse, *part)
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    for a, b, _ in blocks:
        gq, gk, gv = merge.block_attention_backward(q, k[..., a:b, :], v[..., a:b, :], out, lse, dout, causal[:, a:b])
        dq += gq
        dk[..., a:b, :] += gk
        dv[..., a:b, :] += gv
    for got, leaf in zip((dq, dk, dv), leaves):
        assert_close(got, leaf.grad, **TOL)


# ------------------------------------------------------------------------------------- sharding
def test_balanced_split_is_megatrons_index_select():
    s, cp = 24, 3
    x = torch.arange(s).reshape(1, s)
    for r in range(cp):                                    # Megatron: view 2cp chunks, keep r, 2cp-1-r
        megatron = x.view(1, 2 * cp, s // (2 * cp)).index_select(1, torch.tensor([r, 2 * cp - r - 1])).view(1, -1)
        assert torch.equal(sharding.shard(x, r, cp), megatron)
        assert sharding.positions(s, r, cp) == megatron[0].tolist()
    assert sharding.chunk_ids(1, 4) == (1, 6) and sharding.chunk_ids(1, 4, "contiguous") == (2, 3)


@pytest.mark.parametrize("layout", sharding.LAYOUTS)
def test_positions_follow_the_tokens_and_unshard_inverts_shard(layout):
    s, cp = 16, 4
    tokens, labels = torch.arange(100, 100 + s).repeat(2, 1), torch.arange(200, 200 + s).repeat(2, 1)
    parts = []
    for r in range(cp):
        t, y, pos = sharding.batch_transform(r, cp, layout)((tokens, labels))
        assert torch.equal(t - 100, pos.expand_as(t)) and torch.equal(y - 200, pos.expand_as(y))
        parts.append(t)
    assert torch.equal(sharding.unshard(parts, layout), tokens)


def test_causal_work_is_equal_only_under_the_balanced_split():
    for cp in (2, 3, 4, 8):
        s = 4 * cp
        pairs = {lay: [sum(p + 1 for p in sharding.positions(s, r, cp, lay)) for r in range(cp)]
                 for lay in sharding.LAYOUTS}               # query-key pairs, counted from positions
        assert len(set(pairs["balanced"])) == 1
        assert pairs["contiguous"] == sorted(pairs["contiguous"]) and len(set(pairs["contiguous"])) == cp
        assert sharding.causal_pairs(cp) == [2 * cp + 1] * cp
        assert sharding.causal_pairs(cp, "contiguous") == [4 * r + 3 for r in range(cp)]


def test_seq_length_must_divide_by_two_cp():
    with pytest.raises(ValueError, match=r"seq_length 20 is not divisible by 2 \* context_parallel_size = 8"):
        sharding.positions(20, 0, 4)


# ---------------------------------------------------------------------- the ring, in one process
def simulated_cp(q, k, v, dout, cp, layout, causal=True, ids=sharding.chunk_ids, store=sharding.shard):
    """c ranks in a for-loop: each rank's queries over every rank's K/V block in ring order, then
    the backward: dq kept, each block's dK/dV shares summed at its owner. Returns full tensors."""
    ids_ = [ids(r, cp, layout) for r in range(cp)]
    local = [[store(t, r, cp, layout, dim=2) for t in (q, k, v, dout)] for r in range(cp)]
    outs, grads = [], [[None, 0, 0] for _ in range(cp)]
    for r in range(cp):
        qr, _, _, dr = local[r]
        acc = None
        for step in range(cp):
            src = (r - step) % cp
            acc = blockwise.attend(qr, local[src][1], local[src][2], ids_[r], ids_[src], acc, causal)
        out, lse = blockwise.finish(acc, qr)
        outs.append(out)
        delta = (dr * out).sum(-1)
        dq = 0
        for src in range(cp):
            gq, gk, gv = blockwise.attend_backward(qr, local[src][1], local[src][2], out, lse, dr, delta,
                                                   ids_[r], ids_[src], causal)
            dq = dq + gq
            grads[src][1] = grads[src][1] + gk
            grads[src][2] = grads[src][2] + gv
        grads[r][0] = dq
    full = lambda ts: sharding.unshard(ts, layout, dim=2)  # noqa: E731
    return full(outs), *(full([g[i] for g in grads]) for i in range(3))


@pytest.mark.parametrize("cp", [2, 4])
@pytest.mark.parametrize("layout", sharding.LAYOUTS)
@pytest.mark.parametrize("causal", [True, False])
def test_simulated_ring_equals_dense_attention_and_autograd(cp, layout, causal):
    q, k, v, dout = (rand(2, 2, 16, 4) for _ in range(4))
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    want = dense(*leaves, causal=causal)[0]
    want.backward(dout)
    got = simulated_cp(q, k, v, dout, cp, layout, causal)
    for g, w in zip(got, [want.detach()] + [t.grad for t in leaves]):
        assert_close(g, w, **TOL)


def test_planted_bug_wrong_chunk_order_is_caught():
    """Tokens stored (2c-1-r, r) while attention assumes (r, 2c-1-r): the causal mask is wrong."""
    q, k, v, dout = (rand(1, 2, 16, 4) for _ in range(4))
    want = dense(q, k, v)[0]

    def swapped(x, r, cp, layout, dim):
        return torch.cat(sharding.shard(x, r, cp, layout, dim).chunk(2, dim)[::-1], dim)
    ok = simulated_cp(q, k, v, dout, 2, "balanced")[0]
    bad = simulated_cp(q, k, v, dout, 2, "balanced", store=swapped)[0]
    assert torch.allclose(ok, want, **TOL) and not torch.allclose(bad, want, **TOL)


# ------------------------------------------------------------------------------- labkit.calc
def test_cp_bytes_per_comm_type_forward_and_backward():
    s, b, h, e = 1024, 2, 512, 2
    kv = 2 * s / 4 * b * h * e                              # one rank's K and V at CP 4
    p2p = cp_attention_bytes(s, b, h, 4, e, "p2p")
    assert p2p == {"forward": {"send_recv": 3 * kv}, "backward": {"send_recv": 6 * kv}}
    assert cp_layer_bytes(s, b, h, 4, e) == {"send_recv": 9 * kv}   # Megatron's default, total
    ag = cp_attention_bytes(s, b, h, 4, e, "all_gather")
    assert cp_attention_bytes(s, b, h, 4, e, "allgather") == ag           # --cp-comm-type's help spelling
    assert ag["forward"]["all_gather"] == 3 / 4 * 4 * kv and ag["backward"]["reduce_scatter"] == 3 * kv
    a2a = cp_attention_bytes(s, b, h, 4, e, "a2a", hidden_size=h)
    assert a2a["forward"]["all_to_all"] == 3 / 4 * (s / 4 * b * 4 * h * e)   # q, k, v, out
    gqa = cp_attention_bytes(s, b, h // 8, 4, e, "a2a", hidden_size=h)      # GQA: small K/V
    assert gqa["forward"]["all_to_all"] == 3 / 4 * (s / 4 * b * (2 * h + 2 * h // 8) * e)
    assert all(v == 0 for ph in cp_attention_bytes(s, b, h, 1, e, "all_gather").values() for v in ph.values())
    with pytest.raises(ValueError, match="cp_comm_type must be one of"):
        cp_attention_bytes(s, b, h, 2, e, "a2a+p2p")


def test_cp_activation_model_picks_the_kernel_each_comm_type_runs():
    from labkit.calc import MIXED_18, ModelConfig, ParallelConfig
    from labkit.calc.memory import cp_layer_activation_bytes, layer_activation_bytes
    m = ModelConfig(num_layers=2, hidden_size=64, num_attention_heads=4, seq_length=64)
    for cp in (2, 4):
        par = ParallelConfig(world_size=cp, context_parallel_size=cp)
        assert cp_layer_activation_bytes(m, par, "p2p") == layer_activation_bytes(m, par, attention="flash")
        assert cp_layer_activation_bytes(m, par, "a2a") == layer_activation_bytes(m, par, attention="math")
        assert cp_layer_activation_bytes(m, par, "p2p") < cp_layer_activation_bytes(m, par, "a2a")
    assert MIXED_18.bytes_activation == 2


# ------------------------------------------------------------------------------ rules and CLI
@pytest.mark.parametrize("config, message", [
    (dict(context_parallel_size=4, seq_length=20), r"rule: seq_length divisible by 2\*CP; 20 % 8 != 0"),
    (dict(context_parallel_size=4, cp_comm_type="a2a", num_attention_heads=2, hidden_size=32),
     r"cp_comm_type 'a2a' needs heads per TP rank divisible by CP: num_attention_heads 2 / TP 1 = 2, "
     r"not divisible by CP 4"),
    (dict(context_parallel_size=2, tensor_model_parallel_size=2, cp_comm_type="a2a", num_attention_heads=2,
          hidden_size=32), r"num_attention_heads 2 / TP 2 = 1, not divisible by CP 2"),
    (dict(context_parallel_size=2, cp_comm_type="a2a+p2p"), r"no hierarchical 'a2a\+p2p'"),
    (dict(context_parallel_size=2, cp_comm_type="ring"), r"cp_comm_type must be 'p2p', 'all_gather' or 'a2a'"),
    (dict(context_parallel_size=2, attention_dropout=0.1), r"attention_dropout 0.1 with context_parallel_size 2"),
    (dict(context_parallel_size=2, tensor_model_parallel_size=4, sequence_parallel=True, seq_length=12),
     r"12 / 2 % 4 != 0|= 6 is not divisible by tensor_model_parallel_size 4"),   # SP: s/(c t) positions
])
def test_cp_rules_are_value_errors_naming_the_numbers_before_any_process(config, message, monkeypatch):
    import labkit
    import labkit.launcher
    monkeypatch.setattr(labkit.launcher, "launch", lambda *a, **k: pytest.fail("launched"))
    world = config.get("context_parallel_size", 1) * config.get("tensor_model_parallel_size", 1)
    with pytest.raises(ValueError, match=message):
        labkit.train(world_size=world, steps=1, **config)


def test_cli_has_megatrons_cp_flags_and_refuses_a_bad_layout(capsys, monkeypatch):
    import labkit.launcher
    from labkit.__main__ import main, train_parser
    args = vars(train_parser().parse_args(["--context-parallel-size", "2", "--cp-comm-type", "a2a"]))
    assert (args["context_parallel_size"], args["cp_comm_type"]) == (2, "a2a")
    monkeypatch.setattr(labkit.launcher, "launch", lambda *a, **k: pytest.fail("launched"))
    assert main(["train", "--world-size", "4", "--context-parallel-size", "4", "--cp-comm-type", "a2a",
                 "--num-attention-heads", "2", "--hidden-size", "32"]) == 2
    assert "needs heads per TP rank divisible by CP" in capsys.readouterr().err


def test_both_spellings_of_all_gather_are_accepted():
    """Megatron's TransformerConfig and Transformer Engine take "all_gather"; the help text of
    --cp-comm-type (megatron/training/arguments.py, d98e8a64) spells it "allgather"."""
    from labkit.config import TrainConfig
    from labkit.context_parallel.plan import CP_COMM_TYPES
    for kind in ("all_gather", "allgather"):
        assert TrainConfig(context_parallel_size=2, cp_comm_type=kind).validate(2).cp == 2
    assert CP_COMM_TYPES["allgather"] is CP_COMM_TYPES["all_gather"]


def test_the_gpt2xl_cp_table_read_with_labkit_calc():
    """data/cp_gpt2xl_h100.csv under labkit.measure.cp_table.ASSUMED: activations scale with the
    tokens per GPU, and the two runs that ran out of memory are the two calc puts highest."""
    from labkit.calc import MIXED_18, ModelConfig, ParallelConfig, memory_per_stage
    from labkit.measure.cp_table import compare
    df = compare().set_index("row")
    assert list(df.index[df["ran out"]]) == ["r1", "r8"]
    assert set(df["calc GB"].nlargest(2).index) == {"r1", "r8"}
    per_token = df["activations GB"] / df["tokens/GPU"]
    assert (per_token.max() - per_token.min()) / per_token.mean() < 0.02     # s/c x b tokens, flash
    m = ModelConfig(num_layers=48, hidden_size=1600, num_attention_heads=25, seq_length=4096, vocab_size=50257)
    par = ParallelConfig(world_size=2, context_parallel_size=2, micro_batch_size=4, global_batch_size=4)
    assert df.loc["r2", "calc GB"] == round(memory_per_stage(m, par, MIXED_18, attention="flash")[0]["total"] / 1e9, 1)
    assert df["measured GB"].notna().sum() == 6 and (df["error %"].dropna() < 0).all()   # calc below all six

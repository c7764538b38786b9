"""The Context-parallelism lab's checks: right answers pass, each kind of wrong answer fails with a
message that says what differs, and an answer that only calls labkit's own implementation fails
(the check switches it off while it runs, and switches it back on after). The ring-attention
check runs 2- and 4-rank launches (about 15 s on the 2-core machine)."""
from __future__ import annotations

import math

import torch

from labkit import comm
from labkit.check import context_parallel as check
from labkit.context_parallel import sharding
from labkit.context_parallel.merge import merge_partials
from labkit.context_parallel.ring_attention import ring_attention


def good_merge(out_a, lse_a, out_b, lse_b):
    m = torch.maximum(lse_a, lse_b)
    m = torch.where(torch.isneginf(m), torch.zeros_like(m), m)
    w_a, w_b = torch.exp(lse_a - m), torch.exp(lse_b - m)
    total = w_a + w_b
    lse = m + torch.log(total)
    total = torch.where(total == 0, torch.ones_like(total), total)
    return (w_a / total)[..., None] * out_a + (w_b / total)[..., None] * out_b, lse


def no_max_merge(out_a, lse_a, out_b, lse_b):
    total = torch.exp(lse_a) + torch.exp(lse_b)
    return ((torch.exp(lse_a) / total)[..., None] * out_a + (torch.exp(lse_b) / total)[..., None] * out_b,
            torch.log(total))


def no_empty_rows_merge(out_a, lse_a, out_b, lse_b):
    m = torch.maximum(lse_a, lse_b)
    w_a, w_b = torch.exp(lse_a - m), torch.exp(lse_b - m)
    total = w_a + w_b                                      # both -inf: -inf - (-inf) = nan
    return (w_a / total)[..., None] * out_a + (w_b / total)[..., None] * out_b, m + torch.log(total)


def test_merge_check():
    assert check.merge(good_merge)
    r = check.merge(no_max_merge)
    assert not r and "scores near 1000" in r.message and "got nan" in r.message   # nan is a mismatch too
    r = check.merge(no_empty_rows_merge)
    assert not r and "a row that sees no key in either block" in r.message
    r = check.merge(lambda oa, la, ob, lb: ((oa + ob) / 2, torch.logaddexp(la, lb)))
    assert not r and "case 'two random blocks', out" in r.message and "share" in r.hint
    r = check.merge(merge_partials)
    assert not r and "labkit.context_parallel.merge.merge_partials is disabled" in r.message, r.line()
    out, lse = merge_partials(torch.zeros(1, 1, 1, 2), torch.zeros(1, 1, 1), torch.ones(1, 1, 1, 2),
                              torch.zeros(1, 1, 1))                    # switched back on
    assert torch.equal(out, torch.full((1, 1, 1, 2), 0.5))


def megatron_positions(s, cp, r):
    c = s // (2 * cp)
    return [i * c + j for i in (r, 2 * cp - 1 - r) for j in range(c)]


def test_load_balanced_positions_check():
    assert check.load_balanced_positions(megatron_positions)
    r = check.load_balanced_positions(lambda s, cp, rank: list(range(rank * s // cp, (rank + 1) * s // cp)))
    assert not r and "not balanced" in r.message and "[10, 26]" in r.message
    r = check.load_balanced_positions(lambda s, cp, rank: megatron_positions(s, cp, rank)[::-1])
    assert not r and "balanced, but not Megatron's assignment or order" in r.message
    r = check.load_balanced_positions(lambda s, cp, rank: megatron_positions(s, cp, rank)[:-1])
    assert not r and "expected s/cp" in r.message
    r = check.load_balanced_positions(lambda s, cp, rank: sharding.positions(s, rank, cp))
    assert not r and "labkit.context_parallel.sharding.positions is disabled" in r.message, r.line()
    assert sharding.positions(8, 0, 2) == [0, 1, 6, 7]


def ring(group, q, k, v, wrong_direction=False):
    c, r = group.size, group.rank
    s, d = q.shape[2] * c, q.shape[-1]
    q_pos = torch.tensor(megatron_positions(s, c, r))
    out = lse = None
    for step in range(c):
        src = (r + step) % c if wrong_direction else (r - step) % c
        k_pos = torch.tensor(megatron_positions(s, c, src))
        x = (q @ k.transpose(-2, -1) / math.sqrt(d)).masked_fill(k_pos[None, :] > q_pos[:, None], float("-inf"))
        blk_lse = torch.logsumexp(x, -1)
        blk = torch.exp(x - torch.where(torch.isneginf(blk_lse), 0.0, blk_lse)[..., None]) @ v
        out, lse = (blk, blk_lse) if out is None else good_merge(out, lse, blk, blk_lse)
        if step < c - 1:
            k = comm.send_recv(group, k, (r + 1) % c, (r - 1) % c)
            v = comm.send_recv(group, v, (r + 1) % c, (r - 1) % c)
    return out


def ring_gathers(group, q, k, v):
    c, r = group.size, group.rank
    ks, vs = comm.all_gather(group, k, dim=2), comm.all_gather(group, v, dim=2)   # the whole sequence
    s = ks.shape[2]
    order = [p for j in range(c) for p in megatron_positions(s, c, j)]
    q_pos, k_pos = torch.tensor(megatron_positions(s, c, r)), torch.tensor(order)
    x = (q @ ks.transpose(-2, -1) / math.sqrt(q.shape[-1])).masked_fill(k_pos[None, :] > q_pos[:, None], float("-inf"))
    return torch.softmax(x, -1) @ vs


def test_ring_attention_check():
    assert check.ring_attention(ring, cp=2) and check.ring_attention(ring, cp=4)
    assert check.ring_attention(lambda *a: ring(*a, wrong_direction=True), cp=2)     # invisible at CP 2
    r = check.ring_attention(lambda *a: ring(*a, wrong_direction=True), cp=4)
    assert not r and r.message.startswith("CP 4, rank") and "are right" in r.message, r.line()
    r = check.ring_attention(ring_gathers, cp=4)
    assert not r and "right values" in r.message and "all_gather" in r.message, r.line()
    r = check.ring_attention(lambda g, q, k, v: ring_attention(g, q, k, v), cp=2)
    assert not r and "ring_attention is disabled" in r.message, r.line()

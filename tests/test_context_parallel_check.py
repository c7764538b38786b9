"""The Context-parallelism lab's checks: right answers pass, each kind of wrong answer fails with a
message that says what differs, and an answer that only calls labkit's own implementation fails
(the check switches it off while it runs, and switches it back on after)."""
from __future__ import annotations

import torch

from labkit.check import context_parallel as check
from labkit.context_parallel import sharding
from labkit.context_parallel.blockwise import attend, finish
from labkit.context_parallel.cp_comm import ring_exchange
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
    assert not r and "scores near 1000" in r.message and "got inf" in r.message
    r = check.merge(no_empty_rows_merge)
    assert not r and "a row that sees no key in either block" in r.message
    r = check.merge(lambda oa, la, ob, lb: ((oa + ob) / 2, torch.logaddexp(la, lb)))
    assert not r and "case 'two random blocks', out" in r.message and "share" in r.hint
    r = check.merge(merge_partials)
    assert not r and "labkit's own merge_partials was called" in r.message
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
    assert not r and "labkit's own positions was called" in r.message
    assert sharding.positions(8, 0, 2) == [0, 1, 6, 7]


def ring(group, q, k, v, wrong_direction=False):
    c, r = group.size, group.rank
    ids = [sharding.chunk_ids(j, c) for j in range(c)]
    acc, kv = None, (k, v)
    for step in range(c):
        pending = ring_exchange(group, kv) if step < c - 1 else None
        src = (r + step) % c if wrong_direction else (r - step) % c
        acc = attend(q, *kv, ids[r], ids[src], acc)
        if pending is not None:
            kv = tuple(pending.wait())
    return finish(acc, q)[0]


def test_ring_forward_check():
    assert check.ring_forward(ring)
    r = check.ring_forward(lambda *a: ring(*a, wrong_direction=True))   # right at CP 2, wrong at CP 4
    assert not r and r.message.startswith("CP 4, rank 1, output") and "ranks [0, 3] are right" in r.message
    r = check.ring_forward(lambda g, q, k, v: ring_attention(g, q, k, v))
    assert not r and "labkit's own ring_attention was called" in r.message

"""The Expert-parallelism lab's checks (labkit/check/expert_parallel.py) can pass and can fail.

Each passes a correct solution, fails a solution that calls labkit's own implementation (which
raises during the check), and fails the planted bugs with a hint that names them: a combine that
forgets the router weights, one that puts rows back at the wrong tokens, a dispatch that
returns its own counts instead of the received ones. The dispatch runs on 4 gloo ranks.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

import labkit.moe as moe
from labkit.check import expert_parallel as check
from labkit.check import reset_hints


def permute_fn(x, routing_map):
    _, token = routing_map.T.nonzero(as_tuple=True)
    return x[token], token


def combine_fn(y, token, weight, num_tokens):
    return y.new_zeros(num_tokens, y.shape[1]).index_add(0, token, y * weight[:, None])


def forgets_weights(y, token, weight, num_tokens):
    return y.new_zeros(num_tokens, y.shape[1]).index_add(0, token, y)


def wrong_order(y, token, weight, num_tokens):
    return y.new_zeros(num_tokens, y.shape[1]).index_add(0, token.flip(0), y * weight[:, None])


def sorted_destinations(y, token, weight, num_tokens):      # the lab's planted bug
    return y.new_zeros(num_tokens, y.shape[1]).index_add(0, token.sort().values, y * weight[:, None])


def out_of_bounds(y, token, weight, num_tokens):            # a crash is a FAIL, not an error
    return y.new_zeros(num_tokens, y.shape[1]).index_add(0, token.argsort(), y * weight[:, None])


def dispatch_fn(rows, counts, num_experts):
    n = dist.get_world_size()
    recv = torch.empty_like(counts)
    dist.all_to_all_single(recv, counts)                        # split sizes first
    send, got = counts.view(n, -1).sum(1).tolist(), recv.view(n, -1).sum(1).tolist()
    out = rows.new_empty(sum(got), rows.shape[1])
    dist.all_to_all_single(out, rows, got, send)
    return out, recv


def counts_not_exchanged(rows, counts, num_experts):
    out, _ = dispatch_fn(rows, counts, num_experts)
    return out, counts                                          # its own counts, not the received


def calls_labkit(rows, counts, num_experts):
    from labkit.comm import all_to_all
    from labkit.groups import world_group
    n = dist.get_world_size()
    recv = torch.empty_like(counts)
    dist.all_to_all_single(recv, counts)
    return all_to_all(world_group(), rows, recv.view(n, -1).sum(1).tolist(),
                        counts.view(n, -1).sum(1).tolist()), recv


def test_permutation_check():
    reset_hints()
    assert check.permutation(permute_fn, combine_fn)
    assert not check.permutation(lambda x, m: (x[moe.permute(m)[0]], moe.permute(m)[0]), combine_fn)
    assert not check.permutation(lambda x, m: (x[m.nonzero()[:, 0]], m.nonzero()[:, 0]), combine_fn)
    assert not check.permutation(permute_fn, forgets_weights)


def test_combine_check_finds_the_planted_bugs(capsys):
    reset_hints()
    assert check.combine(combine_fn)
    assert not check.combine(forgets_weights)
    assert "UNWEIGHTED" in capsys.readouterr().out
    assert not check.combine(wrong_order)
    assert not check.combine(sorted_destinations)
    assert "go back to the token" in capsys.readouterr().out
    assert not check.combine(out_of_bounds)
    assert "your combine raised" in capsys.readouterr().out
    assert not check.combine(moe.unpermute)
    assert "labkit's own implementation" in capsys.readouterr().out


def test_dispatch_check(capsys):
    reset_hints()
    assert check.dispatch(dispatch_fn)
    assert not check.dispatch(calls_labkit)
    assert "labkit's own implementation" in capsys.readouterr().out
    assert not check.dispatch(counts_not_exchanged)
    assert "received_counts" in capsys.readouterr().out

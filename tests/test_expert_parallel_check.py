"""The Expert-parallelism lab's checks (labkit/check/expert_parallel.py, ep_round_trip.py) can pass
and can fail.

Each passes a correct solution, fails a solution that calls labkit's own implementation (which
raises during the check), and fails the classic bugs with a message that names them: a combine
that forgets the router weights or puts rows back at sorted tokens, a dispatch that returns its
own counts instead of the received ones, split sizes that do not match across ranks (a clear
message, not gloo's abort). The dispatch and the round trip run on 2 and 4 gloo ranks (about 20 s).
"""
from __future__ import annotations

import torch
import torch.distributed as dist

import labkit.moe as moe
from labkit.check import expert_parallel as check


def permute_fn(x, routing_map):
    _, token = routing_map.T.nonzero(as_tuple=True)
    return x[token], token


def combine_fn(y, token, weight, num_tokens):
    return y.new_zeros(num_tokens, y.shape[1]).index_add(0, token, y * weight[:, None])


def forgets_weights(y, token, weight, num_tokens):
    return y.new_zeros(num_tokens, y.shape[1]).index_add(0, token, y)


def sorted_destinations(y, token, weight, num_tokens):      # the lab's planted bug
    return y.new_zeros(num_tokens, y.shape[1]).index_add(0, token.sort().values, y * weight[:, None])


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
    assert check.permutation(permute_fn, combine_fn)
    assert not check.permutation(lambda x, m: (x[moe.permute(m)[0]], moe.permute(m)[0]), combine_fn)
    assert not check.permutation(lambda x, m: (x[m.nonzero()[:, 0]], m.nonzero()[:, 0]), combine_fn)
    assert not check.permutation(permute_fn, forgets_weights)


def round_trip(group, x, probs, routing_map, experts, combine=combine_fn, same_splits=False):
    ep, E = group.size, routing_map.shape[1]
    per = E // ep
    rows, token = permute_fn(x, routing_map)
    counts = routing_map.sum(0)
    got_counts = torch.empty_like(counts)
    dist.all_to_all_single(got_counts, counts, group=group.pg)
    send, recv = counts.view(ep, per).sum(1).tolist(), got_counts.view(ep, per).sum(1).tolist()
    got = rows.new_empty(sum(send if same_splits else recv), rows.shape[1])
    dist.all_to_all_single(got, rows, send if same_splits else recv, send, group=group.pg)
    by_src = list(got.split(got_counts.tolist()))
    outs = [experts[e](torch.cat([by_src[s * per + e] for s in range(ep)])) for e in range(per)]
    pieces = [o.split(got_counts.view(ep, per)[:, e].tolist()) for e, o in enumerate(outs)]
    back = torch.cat([pieces[e][s] for s in range(ep) for e in range(per)])
    returned = rows.new_empty(rows.shape)
    dist.all_to_all_single(returned, back, send, recv, group=group.pg)
    weight = probs[token, torch.repeat_interleave(torch.arange(E), counts)]
    return combine(returned, token, weight, x.shape[0])


def test_round_trip_check_passes_and_names_the_combine_bugs(capsys):
    assert check.round_trip(round_trip, world_size=2)
    r = check.round_trip(lambda *a: round_trip(*a, combine=forgets_weights), world_size=2)
    assert not r and "UNWEIGHTED" in r.message, r.line()
    r = check.round_trip(lambda *a: round_trip(*a, combine=sorted_destinations), world_size=2)
    assert not r and "output" in r.message and "back at the token it came from" in r.hint, r.line()
    r = check.round_trip(lambda *a: round_trip(*a, combine=moe.unpermute), world_size=2)
    assert not r and "labkit's own implementation" in r.message, r.line()
    r = check.round_trip(lambda *a: round_trip(*a, same_splits=True), world_size=2)   # sized by its sends
    assert not r and "output_split_sizes" in r.message and "code -6" not in r.message, r.line()


def test_dispatch_check(capsys):
    assert check.dispatch(dispatch_fn)
    assert not check.dispatch(calls_labkit)
    assert "labkit's own implementation" in capsys.readouterr().out
    assert not check.dispatch(counts_not_exchanged)
    assert "received_counts" in capsys.readouterr().out

"""Checks for the Expert-parallelism lab: the permutation and its inverse, the all-to-all dispatch
with split sizes, and the combine (with a planted bug to find).

* ``permutation(permute_fn, unpermute_fn)``: ``permute_fn(x, routing_map) -> (rows, token_index)``
  (rows grouped by expert, tokens in order within one) and ``unpermute_fn(y, token_index, weight,
  num_tokens) -> out`` (out[t] = sum of t's rows times their weights), compared with a loop over
  experts and tokens written here, on one process.
* ``dispatch(dispatch_fn)``: ``dispatch_fn(rows, counts, num_experts) -> (received, received_counts)``
  on ep gloo ranks with ``torch.distributed.all_to_all_single``: every rank's rows and counts are
  drawn from a seed, so each rank computes what it must receive from all of them, with no
  communication (the independent reference).
* ``combine(combine_fn)``: the whole MoE layer of ``labkit.moe`` with the student's combine in
  place of its inverse permutation, against the dense mixture sum_e p_e expert_e(x) computed
  here (every expert on every token, masked).

labkit's own permutation, combine and all-to-all raise while the student's code runs
(:func:`labkit.check.forbidden`); hints escalate with each failure (:func:`labkit.check.hint`).
"""
from __future__ import annotations

from . import Forbidden, describe_mismatch, forbidden, hint, report, run_student

OWN_PERMUTE = ("labkit.moe:permute", "labkit.moe:unpermute", "labkit.moe:row_weights",
               "labkit.moe:LocalDispatcher.forward")
EPC = "labkit.expert_parallel.ep_comm"
OWN_A2A = (f"{EPC}:all_to_all_autograd", f"{EPC}:_AllToAll.forward",
           "labkit.comm:all_to_all", "labkit.expert_parallel.dispatch:AllToAllDispatcher.forward",
           "labkit.expert_parallel.dispatch:AllToAllDispatcher.split_sizes")


def _routing(num_tokens: int, num_experts: int, k: int, seed: int):
    import torch
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(num_tokens, num_experts, generator=gen, dtype=torch.float64)
    top = logits.topk(k, dim=1)
    routing_map = torch.zeros_like(logits, dtype=torch.bool).scatter(1, top.indices, True)
    probs = torch.zeros_like(logits).scatter(1, top.indices, torch.softmax(top.values, -1))
    return probs, routing_map


def _reference_permutation(x, routing_map):
    rows, tokens = [], []
    for e in range(routing_map.shape[1]):              # expert by expert, tokens in order
        for t in range(routing_map.shape[0]):
            if routing_map[t, e]:
                rows.append(x[t])
                tokens.append(t)
    return rows, tokens


def permutation(permute_fn, unpermute_fn, num_tokens: int = 12, num_experts: int = 4, k: int = 2):
    import torch
    name = "permutation"
    x = torch.randn(num_tokens, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    probs, routing_map = _routing(num_tokens, num_experts, k, 4)
    rows, tokens = _reference_permutation(x, routing_map)
    try:
        with forbidden(*OWN_PERMUTE, why="the permutation is the exercise"):
            got_rows, got_tokens = permute_fn(x, routing_map)
            weight = probs[torch.as_tensor(got_tokens), torch.repeat_interleave(
                torch.arange(num_experts), routing_map.sum(0))]
            out = unpermute_fn(got_rows, got_tokens, weight, num_tokens)
    except Forbidden as e:
        return report(name, False, f"your code called labkit's own implementation: {e}",
                      "write it with torch: nonzero / argsort for the order, index_add for the sum")
    except NotImplementedError:
        return report(name, False, "not written yet", "replace the raise by your code")
    except Exception as e:  # noqa: BLE001 - the student's error, shown as a failed check
        return report(name, False, f"your code raised {type(e).__name__}: {e}",
                      hint(name, permute_fn, "run your functions on a small routing map and read the traceback", "raised"))
    if list(torch.as_tensor(got_tokens).tolist()) != tokens:
        same_set = sorted(torch.as_tensor(got_tokens).tolist()) == sorted(tokens)
        return report(name, False, "token_index is not grouped by expert with tokens in order"
                      + (" (the right tokens, in another order)" if same_set else ""),
                      hint(name, permute_fn, ["rows must be grouped by expert (all of expert 0's "
                                              "tokens, then expert 1's, ...)",
                                              "routing_map.T.nonzero() lists (expert, token) pairs "
                                              "expert by expert"], "order"))
    problem = describe_mismatch(got_rows, torch.stack(rows), 0, 0, "rows: ")
    if problem:
        return report(name, False, problem, hint(name, permute_fn, "rows = x[token_index]", "rows"))
    want = (probs[..., None] * routing_map[..., None] * x[:, None, :]).sum(1)   # sum_e p_e x_t
    problem = describe_mismatch(out, want, 1e-12, 1e-12, "inverse: ")
    if problem:
        return report(name, False, problem, hint(name, unpermute_fn, [
            "the inverse must put each row back at its token and add a token's k rows",
            "start from zeros [num_tokens, h] and index_add(0, token_index, y * weight[:, None])"], "inverse"))
    return report(name, True, f"{len(tokens)} rows grouped by expert; the inverse returns every token's "
                  f"weighted sum of its {k} rows (float64, exact order)")


def _rank_rows(rank: int, num_experts: int, h: int):
    """Rank ``rank``'s sorted rows and their counts per expert (deterministic: the reference)."""
    import torch
    gen = torch.Generator().manual_seed(100 + rank)
    counts = torch.randint(0, 4, (num_experts,), generator=gen)
    rows = torch.randn(int(counts.sum()), h, generator=gen, dtype=torch.float64)
    return rows, counts


def _dispatch_worker(dispatch_fn, num_experts: int, h: int):
    import torch
    import torch.distributed as dist
    n, me = dist.get_world_size(), dist.get_rank()
    rows, counts = _rank_rows(me, num_experts, h)
    with forbidden(*OWN_A2A, why="the dispatch is the exercise"):
        got, got_counts = dispatch_fn(rows, counts, num_experts)
    n_local = num_experts // n
    mine = slice(me * n_local, (me + 1) * n_local)
    want, want_counts = [], []
    for src in range(n):                                # what src sends me: its rows of my experts
        r, c = _rank_rows(src, num_experts, h)
        start = int(c[:mine.start].sum())
        want.append(r[start:start + int(c[mine].sum())])
        want_counts.append(c[mine])
    return {"got": (torch.as_tensor(got), torch.cat(want)),
            "counts": (torch.as_tensor(got_counts).reshape(n, n_local), torch.stack(want_counts))}


def dispatch(dispatch_fn, world_size: int = 4, num_experts: int = 8, h: int = 4):
    name = f"dispatch ({world_size} ranks)"
    results, failed = run_student(name, _dispatch_worker, world_size, dispatch_fn, num_experts, h,
                                  student_fn=dispatch_fn)
    if failed is not None:
        return failed
    hints = {"counts": ["received_counts[j] must be what rank j sends to each of your experts",
                        "exchange the counts first: all_to_all_single of the [E] counts, E/ep per rank"],
             "got": ["the rows you received differ: check the split sizes of all_to_all_single",
                     "input_split_sizes[j] = rows for rank j's experts = counts.view(ep, E/ep).sum(1); "
                     "output_split_sizes[j] = the rows rank j sends you = its counts for your experts"]}
    for r, out in enumerate(results):
        for what in ("counts", "got"):
            problem = describe_mismatch(*out[what], 0, 0, f"rank {r}, {what}: ")
            if problem:
                return report(name, False, problem, hint("dispatch", dispatch_fn, hints[what], what))
    return report(name, True, f"every rank received exactly the rows of its {num_experts // world_size} "
                  f"experts from all {world_size} ranks, in [source rank][expert] order")


def combine(combine_fn, topk: int = 2):
    """The MoE layer with ``combine_fn(y, token_index, weight, num_tokens)`` as its combine."""
    import torch
    import torch.nn.functional as F

    import labkit.moe as moe
    from labkit.config import GPTConfig
    name = "combine"
    cfg = GPTConfig(num_layers=1, hidden_size=8, num_attention_heads=2, num_experts=4,
                    moe_router_topk=topk, moe_ffn_hidden_size=12)
    layer = moe.MoELayer(cfg).double()
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():                       # every weight and bias drawn (none left empty)
        for p in layer.parameters():
            p.copy_(torch.randn(p.shape, generator=gen, dtype=p.dtype) * 0.5)
    x = torch.randn(2, 6, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(6))

    class StudentCombine(torch.nn.Module):      # the layer's dispatcher, with the student's combine
        def forward(self, x, probs, routing_map, experts, capacity=None):
            token, counts = moe.permute(routing_map)
            weight = moe.row_weights(probs, routing_map, token, None)
            return combine_fn(experts(x[token], counts), token, weight, x.shape[0])

    layer.token_dispatcher = StudentCombine()
    try:
        with forbidden("labkit.moe:unpermute", why="the combine is the exercise"):
            got = layer(x)
    except Forbidden as e:
        return report(name, False, f"your code called labkit's own implementation: {e}",
                      "write the sum with index_add")
    except NotImplementedError:
        return report(name, False, "not written yet", "replace the raise by your code")
    except Exception as e:  # noqa: BLE001 - the student's error, shown as a failed check
        return report(name, False, f"your combine raised {type(e).__name__}: {e}",
                      hint(name, combine_fn, ["the rows are not a permutation of the tokens: there are k "
                                              "rows per token, and row i belongs to token_index[i]",
                                              "out.index_add(0, token_index, y * weight[:, None])"], "raised"))
    flat = x.reshape(-1, 8)
    probs, routing_map = layer.router(flat, (2, 6))
    experts = [layer.experts.local_experts[str(e)] for e in range(4)]
    outs = torch.stack([ex.linear_fc2(F.gelu(ex.linear_fc1(flat))) for ex in experts], 1)  # [T, E, h]
    want = (probs[..., None] * outs).sum(1).view_as(x)
    unweighted = (routing_map[..., None] * outs).sum(1).view_as(x)
    problem = describe_mismatch(got, want, 1e-12, 1e-12, "layer output: ")
    if problem:
        weights_missing = describe_mismatch(got, unweighted, 1e-12, 1e-12) is None
        return report(name, False, problem + ("; it equals the UNWEIGHTED sum of the experts" if weights_missing else ""),
                      hint(name, combine_fn, ["each expert's output must be scaled by the router's weight "
                                              "for that token before it is added" if weights_missing else
                                              "each row must go back to the token it came from",
                                              "out.index_add(0, token_index, y * weight[:, None])"]))
    return report(name, True, "the MoE layer with your combine equals sum_e p_e expert_e(x) (float64)")

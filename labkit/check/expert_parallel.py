"""Checks for the Expert-parallelism lab: the permutation and its inverse, the all-to-all dispatch with
split sizes, and a whole dispatch-combine round trip (``ep_round_trip.py``).

* ``permutation(permute_fn, unpermute_fn)``: ``permute_fn(x, routing_map) -> (rows, token_index)``
  (rows grouped by expert, tokens in order within one) and ``unpermute_fn(y, token_index, weight,
  num_tokens) -> out`` (out[t] = sum of t's rows times their weights), on one process; the judge
  compares with a loop over experts and tokens.
* ``dispatch(dispatch_fn)``: ``dispatch_fn(rows, counts, num_experts) -> (received, received_counts)``
  on ep gloo ranks with ``torch.distributed.all_to_all_single``: every rank's rows and counts are
  drawn from a seed, so the judge computes what each rank must receive with no communication.
  Split sizes that do not match across ranks fail with a message naming them (the counting
  process group checks them before gloo would abort the process).

labkit's own permutation, combine and all-to-all raise while the student's code runs.
"""
from __future__ import annotations

from . import describe_mismatch, ep_round_trip, report
from .ep_common import OWN_A2A, OWN_PERMUTE, routing
from .spec import Spec, call, failed, ranks, run

def _reference_permutation(x, routing_map):
    rows, tokens = [], []
    for e in range(routing_map.shape[1]):              # expert by expert, tokens in order
        for t in range(routing_map.shape[0]):
            if routing_map[t, e]:
                rows.append(x[t])
                tokens.append(t)
    return rows, tokens


def _perm_inputs(num_tokens, num_experts, k, seed):
    import torch
    x = torch.randn(num_tokens, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(seed + 3))
    probs, routing_map = routing(num_tokens, num_experts, k, seed + 4)
    return x, probs, routing_map


def _produce_perm(student, num_tokens=12, num_experts=4, k=2, seed=0):
    import torch
    objs = student.load()
    x, probs, routing_map = _perm_inputs(num_tokens, num_experts, k, seed)
    with student.banning(OWN_PERMUTE, "the permutation is the exercise"):
        got, failure = call(objs["permute"], x, routing_map)
        if failure:
            return failure
        try:
            rows, tokens = got
            tokens = torch.as_tensor(tokens)
            weight = probs[tokens, torch.repeat_interleave(torch.arange(num_experts), routing_map.sum(0))]
        except Exception as e:  # noqa: BLE001 - the student's output has the wrong shape
            return {"failed": "raised", "detail": f"permute returned {type(got).__name__}: {type(e).__name__}: {e}"}
        out, failure = call(objs["unpermute"], rows, tokens, weight, num_tokens)
        if failure:
            return failure
    return {"rows": rows, "tokens": tokens, "out": out}


def _judge_perm(data, num_tokens=12, num_experts=4, k=2, seed=0):
    import torch
    name = "permutation"
    bad = failed(name, data, "run your functions on a small routing map and read the traceback")
    if bad is not None:
        return bad
    x, probs, routing_map = _perm_inputs(num_tokens, num_experts, k, seed)
    rows, tokens = _reference_permutation(x, routing_map)
    got_tokens = torch.as_tensor(data["tokens"]).tolist()
    if got_tokens != tokens:
        same = sorted(got_tokens) == sorted(tokens)
        return report(name, False, "token_index is not grouped by expert with tokens in order"
                      + (" (the right tokens, in another order)" if same else ""),
                      "rows must be grouped by expert: all of expert 0's tokens, then expert 1's, ...")
    problem = describe_mismatch(data["rows"], torch.stack(rows), 0, 0, "rows: ")
    if problem:
        return report(name, False, problem, "row i must be x[token_index[i]]")
    want = (probs[..., None] * routing_map[..., None] * x[:, None, :]).sum(1)   # sum_e p_e x_t
    problem = describe_mismatch(data["out"], want, 1e-12, 1e-12, "inverse: ")
    if problem:
        return report(name, False, problem, "the inverse must put each row back at its token and add a token's "
                      "k rows, each times its weight")
    return report(name, True, f"{len(tokens)} rows grouped by expert; the inverse returns every token's weighted "
                  f"sum of its {k} rows (float64, exact order)")


# -- the dispatch ----------------------------------------------------------------------------------
def rank_rows(rank: int, num_experts: int, h: int, seed: int = 0):
    """Rank ``rank``'s sorted rows and their counts per expert (deterministic: the reference)."""
    import torch
    gen = torch.Generator().manual_seed(100 + rank + 1000 * seed)
    counts = torch.randint(0, 4, (num_experts,), generator=gen)
    return torch.randn(int(counts.sum()), h, generator=gen, dtype=torch.float64), counts


def _dispatch_worker(student, num_experts: int, h: int, seed: int):
    import torch
    import torch.distributed as dist

    from . import instrument
    instrument.install()
    fn = student.load()["dispatch"]
    rows, counts = rank_rows(dist.get_rank(), num_experts, h, seed)
    with student.banning(OWN_A2A, "the dispatch is the exercise"):
        got, got_counts = fn(rows, counts, num_experts)
    return {"got": torch.as_tensor(got), "counts": torch.as_tensor(got_counts)}


def _produce_dispatch(student, world_size=4, num_experts=8, h=4, seed=0):
    results, failure = ranks(_dispatch_worker, world_size, student, num_experts, h, seed)
    return failure or results


def _judge_dispatch(data, world_size=4, num_experts=8, h=4, seed=0):
    import torch
    name = f"dispatch ({world_size} ranks)"
    bad = failed(name, data, "print your split sizes on each rank (labkit.launch(..., live_output=True))")
    if bad is not None:
        return bad
    n_local = num_experts // world_size
    for me, out in enumerate(data):
        mine = slice(me * n_local, (me + 1) * n_local)
        want, want_counts = [], []
        for src in range(world_size):                    # what src sends me: its rows of my experts
            r, c = rank_rows(src, num_experts, h, seed)
            start = int(c[:mine.start].sum())
            want.append(r[start:start + int(c[mine].sum())])
            want_counts.append(c[mine])
        got_counts = torch.as_tensor(out["counts"])
        problem = (describe_mismatch(got_counts.reshape(-1), torch.stack(want_counts).reshape(-1), 0, 0,
                                     f"rank {me}, counts: ") if got_counts.numel() == world_size * n_local else
                   f"rank {me}, counts: {got_counts.numel()} numbers, expected ep x E/ep = {world_size * n_local}")
        if problem:
            return report(name, False, problem, "received_counts[j] must be what rank j sends to each of your experts")
        problem = describe_mismatch(out["got"], torch.cat(want), 0, 0, f"rank {me}, rows: ")
        if problem:
            return report(name, False, problem, "the rows you received differ: check the split sizes of "
                          "all_to_all_single (rows per peer, in rank order)")
    return report(name, True, f"every rank received exactly the rows of its {n_local} experts from all "
                  f"{world_size} ranks, in [source rank][expert] order")


PERMUTATION = Spec("permutation", {"permute": "my_permute", "unpermute": "my_unpermute"}, _produce_perm,
                   _judge_perm, cases=({},), forbid=OWN_PERMUTE, why="the permutation is the exercise", hints=(
                       "list the (expert, token) pairs expert by expert: which tensor op does that?",
                       "routing_map.T.nonzero() lists (expert, token) pairs expert by expert; rows = x[token_index]",
                       "the inverse: zeros [num_tokens, h], then index_add(0, token_index, rows * weight[:, None])"))
DISPATCH = Spec("dispatch", {"dispatch": "my_dispatch"}, _produce_dispatch, _judge_dispatch,
                cases=({"world_size": 4},), forbid=OWN_A2A, ranks=True, why="the dispatch is the exercise", hints=(
                    "a rank cannot receive what it cannot size: exchange the counts first",
                    "all_to_all_single of the [E] counts: rank j gets every rank's counts of j's E/ep experts",
                    "input_split_sizes = counts.view(ep, E/ep).sum(1); output_split_sizes = "
                    "received_counts.view(ep, E/ep).sum(1); then one all_to_all_single of the rows"))


SPECS = {s.id: s for s in (PERMUTATION, DISPATCH, ep_round_trip.ROUND_TRIP)}
round_trip = ep_round_trip.round_trip


def hint(exercise_id: str) -> str:
    """Print the next hint of ``exercise_id`` ("permutation", "dispatch", "round-trip")."""
    from .hints import asker
    return asker(SPECS)(exercise_id)


def permutation(permute_fn, unpermute_fn, num_tokens: int = 12, num_experts: int = 4, k: int = 2, seed: int = 0):
    return run(PERMUTATION, {"permute": permute_fn, "unpermute": unpermute_fn}, num_tokens=num_tokens,
               num_experts=num_experts, k=k, seed=seed)


def dispatch(dispatch_fn, world_size: int = 4, num_experts: int = 8, h: int = 4, seed: int = 0):
    return run(DISPATCH, {"dispatch": dispatch_fn}, world_size=world_size, num_experts=num_experts, h=h, seed=seed)

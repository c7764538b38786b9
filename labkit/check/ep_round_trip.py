"""Check for the Expert-parallel lab's third exercise: a whole dispatch-combine round trip.

``student_fn(group, x, probs, routing_map, experts) -> out``: x [T, h] are this rank's tokens,
``probs`` and ``routing_map`` [T, E] the router's weights and choices (k per token), ``experts``
this rank's E/ep experts (``experts[i]`` is global expert r E/ep + i, a function [N, h] -> [N, h]).
The student permutes the token copies by expert, exchanges the counts, sends each rank the rows
of its experts (one ``all_to_all_single``), reorders them per local expert, runs the experts,
sends the results back (the same call with the split sizes swapped) and combines them at their
tokens with the router's weights: Megatron's ``MoEAlltoAllTokenDispatcher`` (Lepikhin et al.
2020, GShard; Fedus et al. 2021). The judge compares every rank's output with the dense mixture
sum_e p[t, e] expert_e(x_t) computed over all E experts on one process, and the bytes counted on
every group: the counts and two all-to-alls of the rows that leave the rank, nothing else.
"""
from __future__ import annotations

from . import describe_mismatch, report
from .ep_common import OWN_A2A, OWN_PERMUTE, routing
from .spec import Spec, failed, ranks, run
from .compare import far

H, F, K = 6, 10, 2


class Expert:
    """One expert MLP, float64: x -> W2 gelu(W1 x + b1) + b2 (its own seeded weights)."""

    def __init__(self, e: int, seed: int):
        import torch
        gen = torch.Generator().manual_seed(1000 * seed + e)
        def draw(*shape):
            return torch.randn(*shape, generator=gen, dtype=torch.float64)
        self.w1, self.b1 = draw(F, H), draw(F)
        self.w2, self.b2 = draw(H, F) / 3, draw(H)

    def __call__(self, x):
        import torch.nn.functional as fn
        return fn.linear(fn.gelu(fn.linear(x, self.w1, self.b1)), self.w2, self.b2)


def tokens(rank: int, num_tokens: int, num_experts: int, seed: int):
    import torch
    x = torch.randn(num_tokens, H, dtype=torch.float64, generator=torch.Generator().manual_seed(50 + rank + 100 * seed))
    probs, routing_map = routing(num_tokens, num_experts, K, 70 + rank + 100 * seed)
    return x, probs, routing_map


def _worker(student, num_tokens: int, num_experts: int, seed: int):
    import torch
    import torch.distributed as dist

    from ..groups import world_group

    from . import instrument
    instrument.install()
    fn = student.load()["moe"]
    group = world_group()
    r, ep = dist.get_rank(), dist.get_world_size()
    x, probs, routing_map = tokens(r, num_tokens, num_experts, seed)
    local = [Expert(e, seed) for e in range(r * num_experts // ep, (r + 1) * num_experts // ep)]
    before = instrument.snapshot()
    with student.banning(OWN_PERMUTE + OWN_A2A, "the round trip is the exercise"):
        out = fn(group, x, probs, routing_map, local)
    return {"out": torch.as_tensor(out).detach(), "counts": instrument.difference(instrument.snapshot(), before)}


def _produce(student, world_size=4, num_tokens=8, num_experts=8, seed=0):
    results, failure = ranks(_worker, world_size, student, num_tokens, num_experts, seed)
    return failure or results


def _judge(data, world_size=4, num_tokens=8, num_experts=8, seed=0):
    import torch
    title = f"moe_round_trip ({world_size} ranks, {num_experts} experts)"
    bad = failed(title, data, "print each rank's split sizes (labkit.launch(..., live_output=True))")
    if bad is not None:
        return bad
    experts = [Expert(e, seed) for e in range(num_experts)]
    per = num_experts // world_size
    for r, out in enumerate(data):
        x, probs, routing_map = tokens(r, num_tokens, num_experts, seed)
        outs = torch.stack([ex(x) for ex in experts], 1)              # [T, E, h]: every expert, every token
        want = (probs[..., None] * outs).sum(1)
        unweighted = (routing_map[..., None] * outs).sum(1)
        problem = describe_mismatch(out["out"], want, 1e-12, 1e-12, f"rank {r}, output: ")
        if problem:
            if describe_mismatch(out["out"], unweighted, 1e-12, 1e-12) is None:
                problem += "; it equals the UNWEIGHTED sum of the experts"
            return report(title, False, problem, "each token's output is the sum over its k experts of the "
                          "router's weight times that expert's output, back at the token it came from")
    for r, out in enumerate(data):
        _, _, routing_map = tokens(r, num_tokens, num_experts, seed)
        away = int(routing_map.sum()) - int(routing_map[:, r * per:(r + 1) * per].sum())   # copies sent out
        back = sum(int(tokens(j, num_tokens, num_experts, seed)[2][:, r * per:(r + 1) * per].sum())
                   for j in range(world_size) if j != r)                                  # results returned
        want = (away + back) * H * 8
        c = out["counts"]
        got = c.get("all_to_all", {}).get("by_dtype", {}).get("float64", 0.0)
        if set(c) - {"all_to_all"} or far(got, want, 0.5):
            ops = ", ".join(f"{op} {v['bytes']:.0f}" for op, v in sorted(c.items())) or "nothing"
            return report(title, False, f"right output, but rank {r} sent {ops} bytes; the rows that leave the "
                          f"rank, there and back, are {want} bytes of float64 (plus the counts), all-to-all only",
                          "one all_to_all_single of the counts, one of the rows there, one back; no gather")
    return report(title, True, "every rank's output equals sum_e p_e expert_e(x) over all experts (float64, 1e-12); "
                  "only the rows that leave a rank crossed the wire, by all-to-all")


ROUND_TRIP = Spec("round-trip", {"moe": "my_moe_ep"}, _produce, _judge,
                  cases=({"world_size": 2, "num_experts": 4}, {"world_size": 4, "num_experts": 8}),
                  forbid=OWN_PERMUTE + OWN_A2A, ranks=True, why="the round trip is the exercise", hints=(
                      "six steps: permute, exchange counts, send rows, run your experts, send results back, "
                      "combine; the way back is the way there with the split sizes swapped",
                      "received rows come [source rank][local expert]; an expert needs its rows together: "
                      "reorder them to [local expert][source] before, and back after",
                      "after the return trip the rows are in your permuted order again: your my_unpermute with "
                      "the router's weight of each row puts them back at their tokens"))
SPECS = {ROUND_TRIP.id: ROUND_TRIP}


def round_trip(student_fn, world_size: int = 2, num_tokens: int = 8, num_experts: int = 4, seed: int = 0):
    """Run the student's expert-parallel MoE forward on ``world_size`` ranks; print one [check] line."""
    return run(ROUND_TRIP, {"moe": student_fn}, world_size=world_size, num_tokens=num_tokens,
               num_experts=num_experts, seed=seed)

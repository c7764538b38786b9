"""Check for the Context-parallel lab's third exercise: a whole ring-attention forward with its merge.

``student_fn(group, q, k, v) -> out``: q, k, v [b, n, s/c, d] are this rank's two chunks of the
load-balanced split (chunks r and 2c-1-r, Megatron's ``get_batch_on_this_cp_rank``); out is the
causal attention of these queries over the whole sequence. The student passes K/V round the ring
(each rank sends to r+1 and receives from r-1, c-1 times), attends over each block with the
causal mask of the *positions* the block holds, and merges the blocks with the online softmax
(Liu et al. 2023, ring attention; the lab's exercises 1 and 2 are the pieces).

Run at CP 2 and CP 4 (a ring whose direction is wrong can pass at 2 ranks: r+1 = r-1 mod 2). The
judge compares every rank's output with dense causal attention over the full sequence, and the
bytes counted below labkit on every group: K and V sent c-1 times, point-to-point only.
"""
from __future__ import annotations

import math

from . import describe_mismatch, report
from .spec import Spec, failed, ranks, run
from .compare import far, same

ATOL = RTOL = 1e-10
CPA = "labkit.context_parallel"
OWN_RING = (f"{CPA}.ring_attention:ring_attention", f"{CPA}.ring_attention:_RingAttention.forward",
            f"{CPA}.allgather_attention:allgather_attention", f"{CPA}.a2a_attention:a2a_attention",
            f"{CPA}.merge:merge_partials", f"{CPA}.merge:block_attention", f"{CPA}.blockwise:attend",
            f"{CPA}.blockwise:finish")


def inputs(shape, seed: int):
    import torch
    b, n, s, d = shape
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(b, n, s, d, generator=gen, dtype=torch.float64) for _ in range(3)]


def positions(s: int, c: int, r: int) -> list[int]:
    """Rank r's positions in Megatron's load-balanced split (the reference, written out)."""
    size = s // (2 * c)
    return [i * size + j for i in (r, 2 * c - 1 - r) for j in range(size)]


def _worker(student, shape, seed: int, cp: int):
    from ..groups import world_group

    from . import instrument
    instrument.install()
    fn = student.load()["ring"]
    group = world_group()                                     # the CP group: every rank of this launch
    q, k, v = inputs(shape, seed)
    mine = positions(shape[2], cp, group.rank)
    local = [t[:, :, mine].clone() for t in (q, k, v)]
    before = instrument.snapshot()
    with student.banning(OWN_RING, "the ring is the exercise"):
        got = fn(group, *local)
    return {"got": got.detach() if hasattr(got, "detach") else None, "rank": group.rank,
            "counts": instrument.difference(instrument.snapshot(), before)}


def _produce(student, cp=2, shape=(1, 2, 16, 4), seed=0):
    results, failure = ranks(_worker, cp, student, list(shape), seed, cp)
    return failure or results


def _judge(data, cp=2, shape=(1, 2, 16, 4), seed=0):
    import torch
    title = f"ring_attention (CP {cp})"
    bad = failed(title, data, "run your ring on one case in the notebook and read the traceback")
    if bad is not None:
        return bad
    b, n, s, d = shape
    q, k, v = inputs(shape, seed)
    x = (q @ k.transpose(-2, -1)) / math.sqrt(d)               # the dense reference, written plainly
    dense = torch.softmax(x.masked_fill(torch.ones(s, s, dtype=torch.bool).triu(1), float("-inf")), -1) @ v
    if not same([out["rank"] for out in data], list(range(cp))):
        return report(title, False, "the results are not CP ranks 0..cp-1 in order", "return what the stub returns")
    wrong = []
    for out in data:
        r = out["rank"]
        if out["got"] is None:
            return report(title, False, f"CP rank {r} returned no tensor", "return the attention output [b, n, s/c, d]")
        problem = describe_mismatch(out["got"], dense[:, :, positions(s, cp, r)], ATOL, RTOL,
                                    what=f"CP {cp}, rank {r}, output: ")
        if problem:
            wrong.append((r, problem))
    if wrong:
        right = sorted({out["rank"] for out in data} - {r for r, _ in wrong})
        return report(title, False, wrong[0][1] + f" (ranks {right} are right)", "after `step` exchanges, whose "
                      "K/V block does a rank hold, and which positions does that block cover?")
    kv = 2 * b * n * (s // cp) * d * 8
    for out in data:
        c = out["counts"]
        got = c.get("send", {}).get("by_dtype", {}).get("float64", 0.0)
        if set(c) - {"send", "recv"} or far(got, (cp - 1) * kv, 0.5):
            ops = ", ".join(f"{op} {vv['bytes']:.0f}" for op, vv in sorted(c.items())) or "nothing"
            return report(title, False, f"right values, but rank {out['rank']} sent {ops} bytes; a ring passes "
                          f"its K/V block on cp-1 times, {(cp - 1) * kv:.0f} bytes, point-to-point only",
                          "one send_recv of (k, v) per step but the last; never gather the sequence")
    return report(title, True, f"equals dense causal attention on every rank at CP {cp} (float64, atol {ATOL:g}); "
                  "K/V passed cp-1 times round the ring, point-to-point only")


RING = Spec("ring-attention", {"ring": "my_ring_attention"}, _produce, _judge,
            cases=({"cp": 2}, {"cp": 4}), forbid=OWN_RING, ranks=True, why="the ring is the exercise", hints=(
                "each step: attend your queries over the K/V block you hold (masking keys at later positions "
                "than the query), merge it into what you have, pass the block on to rank r+1",
                "blocks come FROM rank r-1: after `step` exchanges you hold rank (r - step) % c's block, whose "
                "positions are load_balanced_positions(s, c, (r - step) % c)",
                "block attention: scores = q @ k^T / sqrt(d), masked_fill(k_pos > q_pos, -inf); lse = "
                "logsumexp(scores, -1); out = exp(scores - lse) @ v (0 where lse is -inf); then your merge"))
SPECS = {RING.id: RING}


def ring_attention(student_fn, cp: int = 2, shape=(1, 2, 16, 4), seed: int = 0):
    """``student_fn(group, q, k, v) -> out``: causal ring attention forward on the load-balanced split
    (q, k, v [b, n, s/cp, d] of this rank) at CP ``cp``, against dense attention."""
    return run(RING, {"ring": student_fn}, cp=cp, shape=list(shape), seed=seed)

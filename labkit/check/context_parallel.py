"""Checks for the Context-parallelism lab: the online-softmax merge, the load-balanced chunks, and a
whole ring-attention forward built from them (``cp_ring.py``).

Each check compares the student's function with an independent reference written in the judge
(plain softmax over the concatenated keys; positions from the definition of the split; dense
causal attention over the whole sequence), and names the first thing that differs and what it
looks like, not the code that fixes it. labkit's own implementation of the same thing raises
while the student's code runs, so a function that only calls it cannot pass.
"""
from __future__ import annotations

from . import describe_mismatch, report
from .spec import Spec, call, failed, run
from .compare import same

ATOL = RTOL = 1e-10  # float64: only the order of the sums differs


def _lse_mismatch(got, expected, what: str) -> str | None:
    import torch
    got = torch.as_tensor(got, dtype=torch.float64)
    if got.shape != expected.shape:
        return f"{what}shape {tuple(got.shape)}, expected {tuple(expected.shape)}"
    neg = torch.isneginf(expected)
    if not torch.equal(torch.isneginf(got), neg):
        i = tuple(int(v) for v in (torch.isneginf(got) != neg).nonzero()[0])
        return f"{what}element {i}: got {got[i].item():.6g}, expected {expected[i].item():.6g}"
    zero = torch.zeros_like(expected)                      # -inf where both are: equal, compare the rest
    return describe_mismatch(torch.where(neg, zero, got), torch.where(neg, zero, expected), ATOL, RTOL, what=what)


def _merge_cases(seed: int = 0):
    """{case: (block A, block B, reference (out, lse))}; blocks are (out, lse) of q over their keys."""
    import torch
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, 2, 3, 4, generator=gen, dtype=torch.float64) for _ in range(3))
    k2, v2 = (torch.randn(1, 2, 5, 4, generator=gen, dtype=torch.float64) for _ in range(2))

    def part(q, k, v, hide=None):                          # one block's (out, lse), written plainly
        x = q @ k.transpose(-2, -1) / 2.0
        if hide is not None:
            x = x.masked_fill(hide, float("-inf"))
        lse = torch.logsumexp(x, -1)
        p = torch.exp(x - torch.where(torch.isneginf(lse), 0.0, lse)[..., None])
        return p @ v, lse

    def ref(q, hide_a=None, hide_b=None):                  # softmax over all keys at once
        x = torch.cat([q @ k.transpose(-2, -1), q @ k2.transpose(-2, -1)], -1) / 2.0
        for hide, cols in ((hide_a, slice(0, 3)), (hide_b, slice(3, 8))):
            if hide is not None:
                x[..., cols] = x[..., cols].masked_fill(hide, float("-inf"))
        lse = torch.logsumexp(x, -1)
        p = torch.nan_to_num(torch.softmax(x, -1))         # a row with no key: 0, not nan
        return p @ torch.cat([v, v2], -2), lse

    all_b = torch.ones(3, 5, dtype=torch.bool)
    rows = torch.zeros(3, 3, dtype=torch.bool)
    rows[1] = True                                         # query row 1 sees nothing in block A
    big = q * 1000.0                                       # log-sum-exp near 10^3: exp overflows
    return {
        "two random blocks": (part(q, k, v), part(q, k2, v2), ref(q)),
        "scores near 1000 (exp overflows float64)": (part(big, k, v), part(big, k2, v2), ref(big)),
        "block B fully masked (lse -inf, out 0)": (part(q, k, v), part(q, k2, v2, all_b), ref(q, None, all_b)),
        "a row that sees no key in either block": (part(q, k, v, rows), part(q, k2, v2, all_b[:, :5] & rows[:, :1]),
                                                    ref(q, rows, all_b & rows[:, :1])),
    }


MERGE_HINTS = {
    "two random blocks": "each partial output is normalized within its own block: weigh it by that "
                         "block's share of the total softmax mass, which the two lse values give",
    "scores near 1000 (exp overflows float64)": "exp(1000) is inf in float64: work with differences "
                                                "of lse values (subtract the larger one first)",
    "block B fully masked (lse -inf, out 0)": "a block with lse = -inf holds no probability mass: "
                                              "it must change neither out nor lse",
    "a row that sees no key in either block": "when both lse are -inf the row keeps out 0 and lse "
                                              "-inf; avoid computing -inf - (-inf) = nan",
}
OWN_MERGE = ("labkit.context_parallel.merge:merge_partials",)


def _produce_merge(student, seed=0):
    fn = student.load()["merge"]
    out = {}
    with student.banning(OWN_MERGE, "the merge is the exercise"):
        for case, ((oa, la), (ob, lb), _) in _merge_cases(seed).items():
            got, failure = call(fn, oa.clone(), la.clone(), ob.clone(), lb.clone())
            if failure:
                return {**failure, "detail": f"case '{case}': {failure['detail']}"}
            try:
                got_out, got_lse = got
            except (TypeError, ValueError):
                return {"failed": "raised", "detail": f"case '{case}': returned {type(got).__name__}, not a tuple "
                        "(out, lse)"}
            out[case] = [got_out, got_lse]
    return out


def _judge_merge(data, seed=0):
    name = "merge"
    bad = failed(name, data, "run your merge on two small blocks in the notebook and read the traceback")
    if bad is not None:
        return bad
    for case, (_, _, (out, lse)) in _merge_cases(seed).items():
        got_out, got_lse = data[case]
        problem = (describe_mismatch(got_out, out, ATOL, RTOL, what=f"case '{case}', out: ")
                   or _lse_mismatch(got_lse, lse, f"case '{case}', lse: "))
        if problem:
            return report(name, False, problem, MERGE_HINTS[case])
    return report(name, True, f"equals softmax over both blocks at once in all {len(MERGE_HINTS)} cases "
                  f"(float64, atol {ATOL:g}), large scores and masked blocks included")


def _work(pos) -> int:
    return sum(p + 1 for p in pos)                          # causal query-key pairs of these queries


SIZES = ((8, 2), (16, 2), (16, 4), (24, 3), (32, 8))
OWN_SPLIT = tuple(f"labkit.context_parallel.sharding:{n}" for n in ("chunk_ids", "positions", "shard"))


def _produce_split(student, sizes=SIZES):
    fn = student.load()["split"]
    out = {}
    with student.banning(OWN_SPLIT, "the split is the exercise"):
        for s, cp in sizes:
            ranks_ = []
            for r in range(cp):
                got, failure = call(fn, s, cp, r)
                if failure:
                    return {**failure, "detail": f"s={s}, cp={cp}: {failure['detail']}"}
                try:
                    ranks_.append([int(p) for p in got])
                except (TypeError, ValueError):
                    return {"failed": "raised", "detail": f"s={s}, cp={cp}: return a list of ints"}
            out[f"{s},{cp}"] = ranks_
    return out


def _judge_split(data, sizes=SIZES):
    name = "load_balanced_positions"
    bad = failed(name, data, "return a list of ints")
    if bad is not None:
        return bad
    for s, cp in sizes:
        c, where, got = s // (2 * cp), f"s={s}, cp={cp}", data[f"{s},{cp}"]
        sizes_got = [len(p) for p in got]
        if sizes_got != [s // cp] * cp:
            return report(name, False, f"{where}: ranks hold {sizes_got} tokens, expected s/cp = {s // cp} each",
                          "each rank holds 2 chunks of s / (2 cp) tokens")
        seen = sorted(p for pos in got for p in pos)
        if not same(seen, list(range(s))):
            return report(name, False, f"{where}: positions held are not 0..{s - 1} exactly once (missing "
                          f"{sorted(set(range(s)) - set(seen))[:4]})", "cut the sequence into 2 cp equal chunks "
                          "and give every chunk to one rank")
        work = [_work(p) for p in got]
        if len(set(work)) > 1:
            return report(name, False, f"{where}: causal work (query-key pairs) per rank {work}: not balanced",
                          "a token at position p attends to p + 1 keys: pair an early chunk with a late one")
        for r, pos in enumerate(got):
            held = [pos[0] // c, pos[-1] // c]
            if held != [r, 2 * cp - 1 - r] or pos != [i * c + j for i in held for j in range(c)]:
                return report(name, False, f"{where}: rank {r} holds {pos[:2 * c]} (chunks {held}); balanced, "
                              "but not Megatron's assignment or order", "Megatron's get_batch_on_this_cp_rank: "
                              "rank r keeps the r-th chunk from the start, then the r-th from the end, each in order")
    return report(name, True, f"equals Megatron's split for {len(sizes)} (s, cp) sizes: every position once, "
                  "the same causal work on every rank")


MERGE = Spec("merge", {"merge": "merge"}, _produce_merge, _judge_merge, cases=({},), forbid=OWN_MERGE, nonfinite=True,
             why="the merge is the exercise", hints=(
                 "write out = (w_a out_a + w_b out_b) / (w_a + w_b) with w = exp(lse): which weights, and why?",
                 "subtract m = max(lse_a, lse_b) before exp so nothing overflows; lse = m + log(w_a + w_b)",
                 "guard the rows where both lse are -inf: use m = 0 there and a total of 1 in the division"))
SPLIT = Spec("split", {"split": "load_balanced_positions"}, _produce_split, _judge_split, cases=({},),
             forbid=OWN_SPLIT, why="the split is the exercise", hints=(
                 "2 cp chunks of s / (2 cp) tokens: which two does rank r hold?",
                 "chunk r and chunk 2 cp - 1 - r, in that order, each in position order"))


def _specs():
    from . import cp_ring
    return {sp.id: sp for sp in (MERGE, SPLIT, cp_ring.RING)}


def hint(exercise_id: str) -> str:
    """Print the next hint of ``exercise_id`` ("merge", "split", "ring-attention")."""
    from .hints import asker
    return asker(_specs())(exercise_id)


def __getattr__(name):
    if name == "SPECS":
        return _specs()
    if name == "ring_attention":
        from .cp_ring import ring_attention
        return ring_attention
    raise AttributeError(name)


def merge(student_fn, seed: int = 0):
    """``student_fn(out_a, lse_a, out_b, lse_b) -> (out, lse)``: merge two partial attention
    results of the same queries (out [b, n, sq, d] normalized within its block, lse [b, n, sq])."""
    return run(MERGE, {"merge": student_fn}, seed=seed)


def load_balanced_positions(student_fn, sizes=SIZES):
    """``student_fn(seq_length, cp, cp_rank) -> list of positions`` the rank holds, in the order
    it stores them: Megatron's split into 2 x cp chunks, rank r holding chunk r and its mirror."""
    return run(SPLIT, {"split": student_fn}, sizes=[list(x) for x in sizes])

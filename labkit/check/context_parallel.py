"""Checks for the Context-parallelism lab: the online-softmax merge, the load-balanced chunks, a ring step.

Each check compares the student's function with an independent reference written here (plain
softmax over the concatenated keys; positions from the definition of the split; dense causal
attention over the whole sequence), and names the first thing that differs and what it looks
like, not the code that fixes it. While a check runs, labkit's own implementation of the same
thing raises (:func:`forbid`), so a function that only calls it cannot pass.
"""
from __future__ import annotations

import contextlib
import math

from . import describe_mismatch, report, run_student

ATOL = RTOL = 1e-10  # float64: only the order of the sums differs


@contextlib.contextmanager
def forbid(*functions):
    """Make each of ``functions`` raise while the block runs (its code object is swapped, so a
    reference the student took earlier raises too); restored afterwards."""
    def stub(*args, **kwargs):
        name = __import__("sys")._getframe().f_code.co_name
        raise RuntimeError(f"labkit's own {name} was called: this exercise asks you to write it")
    saved = [(f, f.__code__) for f in functions]
    try:
        for f, code in saved:
            f.__code__ = stub.__code__.replace(co_name=code.co_name)
        yield
    finally:
        for f, code in saved:
            f.__code__ = code


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


def _raised(name: str, where: str, e: Exception, hint: str):
    if "labkit's own" in str(e):
        hint = "write it with torch operations; labkit's implementation is switched off during the check"
    elif isinstance(e, NotImplementedError):
        hint = "replace the `raise NotImplementedError` of the exercise cell with your code"
    return report(name, False, f"{where}: {type(e).__name__}: {e}", hint)


def _merge_cases():
    """{case: (block A, block B, reference (out, lse))}; blocks are (out, lse) of q over their keys."""
    import torch
    gen = torch.Generator().manual_seed(0)
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


def merge(student_fn):
    """``student_fn(out_a, lse_a, out_b, lse_b) -> (out, lse)``: merge two partial attention
    results of the same queries (out [b, n, sq, d] normalized within its block, lse [b, n, sq])."""
    from ..context_parallel import merge as labkit_merge
    name = "merge"
    with forbid(labkit_merge.merge_partials):
        for case, ((oa, la), (ob, lb), (out, lse)) in _merge_cases().items():
            try:
                got = student_fn(oa.clone(), la.clone(), ob.clone(), lb.clone())
                got_out, got_lse = got
            except Exception as e:  # noqa: BLE001 - the student's error is the message
                return _raised(name, f"case '{case}'", e, "return a tuple (out, lse)")
            problem = (describe_mismatch(got_out, out, ATOL, RTOL, what=f"case '{case}', out: ")
                       or _lse_mismatch(got_lse, lse, f"case '{case}', lse: "))
            if problem:
                return report(name, False, problem, MERGE_HINTS[case])
    return report(name, True, f"equals softmax over both blocks at once in all {len(MERGE_HINTS)} cases "
                  f"(float64, atol {ATOL:g}), large scores and masked blocks included")


def _work(pos) -> int:
    return sum(p + 1 for p in pos)                          # causal query-key pairs of these queries


def load_balanced_positions(student_fn, sizes=((8, 2), (16, 2), (16, 4), (24, 3), (32, 8))):
    """``student_fn(seq_length, cp, cp_rank) -> list of positions`` the rank holds, in the order
    it stores them: Megatron's split into 2 x cp chunks, rank r holding chunk r and its mirror."""
    from ..context_parallel import sharding
    name = "load_balanced_positions"
    with forbid(sharding.chunk_ids, sharding.positions, sharding.shard):
        for s, cp in sizes:
            c = s // (2 * cp)
            try:
                got = [[int(p) for p in student_fn(s, cp, r)] for r in range(cp)]
            except Exception as e:  # noqa: BLE001
                return _raised(name, f"s={s}, cp={cp}", e, "return a list of ints")
            where = f"s={s}, cp={cp}"
            sizes_got = [len(p) for p in got]
            if sizes_got != [s // cp] * cp:
                return report(name, False, f"{where}: ranks hold {sizes_got} tokens, expected s/cp = {s // cp} each",
                              "each rank holds 2 chunks of s / (2 cp) tokens")
            seen = sorted(p for pos in got for p in pos)
            if seen != list(range(s)):
                return report(name, False, f"{where}: positions held are not 0..{s - 1} exactly once "
                              f"(missing {sorted(set(range(s)) - set(seen))[:4]}, repeated or out of range "
                              f"{sorted(p for p in set(seen) if seen.count(p) > 1 or not 0 <= p < s)[:4]})",
                              "cut the sequence into 2 cp equal chunks and give every chunk to one rank")
            work = [_work(p) for p in got]
            if len(set(work)) > 1:
                return report(name, False, f"{where}: causal work (query-key pairs) per rank {work}: not balanced",
                              "a token at position p attends to p + 1 keys: pair an early chunk with a late one")
            for r, pos in enumerate(got):
                held = [pos[0] // c, pos[-1] // c]
                expected = [r, 2 * cp - 1 - r]
                if held != expected or pos != [i * c + j for i in held for j in range(c)]:
                    return report(name, False, f"{where}: rank {r} holds {pos[:2 * c]}{'...' if len(pos) > 2 * c else ''} "
                                  f"(chunks {held}); balanced, but not Megatron's assignment or order",
                                  "Megatron's get_batch_on_this_cp_rank: rank r keeps the r-th chunk counted "
                                  "from the start, then the r-th counted from the end, each in order")
    return report(name, True, f"equals Megatron's split for {len(sizes)} (s, cp) sizes: every position once, "
                  f"the same causal work on every rank")


def _ring_worker(student_fn, shape, seed: int):
    import torch
    import torch.distributed as dist

    from ..context_parallel import a2a_attention, allgather_attention, ring_attention
    from ..groups import new_group, world_group
    world, me = dist.get_world_size(), dist.get_rank()
    groups = {world: world_group()}
    for start in range(0, world, 2):                       # CP 2 on the pairs (0, 1), (2, 3)
        g = new_group("cp", range(start, start + 2))
        if me in g.ranks:
            groups[2] = g
    b, n, s, d = shape
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(b, n, s, d, generator=gen, dtype=torch.float64) for _ in range(3))
    x = (q @ k.transpose(-2, -1)) / math.sqrt(d)           # the dense reference, written plainly
    x = x.masked_fill(torch.ones(s, s, dtype=torch.bool).triu(1), float("-inf"))
    dense = torch.softmax(x, -1) @ v
    out = {}
    with forbid(ring_attention.ring_attention, ring_attention._RingAttention.forward,
                allgather_attention.allgather_attention, a2a_attention.a2a_attention):
        for cp in sorted(groups):
            group, c = groups[cp], s // (2 * cp)
            r = group.rank
            mine = [i * c + j for i in (r, 2 * cp - 1 - r) for j in range(c)]   # balanced split
            local = [t[:, :, mine].clone() for t in (q, k, v)]
            before = group.stats.snapshot().get("send_recv", {}).get("bytes", 0.0)
            got = student_fn(group, *local)
            sent = group.stats.snapshot().get("send_recv", {}).get("bytes", 0.0) - before
            out[cp] = {"got": got.detach(), "expected": dense[:, :, mine], "sent": sent,
                       "kv_bytes": 2 * local[1].numel() * 8}
    return out


def ring_forward(student_fn, shape=(1, 2, 16, 4), seed: int = 0):
    """``student_fn(group, q, k, v) -> out``: causal ring attention forward on the load-balanced
    split (q, k, v [b, n, s/cp, d] of this rank); run at CP 2 and CP 4 against dense attention."""
    name = "ring_forward"
    results, failed = run_student(name, _ring_worker, 4, student_fn, shape, seed)
    if failed is not None:
        return failed
    for cp in (2, 4):
        for r in range(cp):
            res = results[r][cp]
            problem = describe_mismatch(res["got"], res["expected"], ATOL, RTOL,
                                        what=f"CP {cp}, rank {r}, output: ")
            if problem:
                right = [j for j in range(cp) if describe_mismatch(results[j][cp]["got"],
                                                                    results[j][cp]["expected"], ATOL, RTOL) is None]
                return report(name, False, problem + f" (CP {cp}: ranks {right} are right)",
                              "after `step` exchanges, whose K/V block does a rank hold, and which "
                              "chunks does that block cover?")
        sent, kv = results[0][cp]["sent"], results[0][cp]["kv_bytes"]
        if sent != (cp - 1) * kv:
            return report(name, False, f"CP {cp}: rank 0 sent {sent:.0f} bytes with ring_exchange, a ring "
                          f"forward sends its K/V block cp-1 times: {(cp - 1) * kv:.0f}",
                          "post one exchange per step but the last")
    return report(name, True, f"equals dense causal attention on every rank at CP 2 and CP 4 (float64, "
                  f"atol {ATOL:g}); K/V sent cp-1 times round the ring")

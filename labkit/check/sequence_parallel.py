"""Checks for the Sequence-parallel lab: the conjugate pair g / g-bar (Korthikanti et al. 2022,
Sec. 4.2.2), and the whole SP MLP block with the gradient sum it needs.

``sp_conjugates(g, g_bar)``: ``g(group, x)`` all-gathers the sequence shards [b, s/t, h] -> [b, s, h]
(backward: reduce-scatter), ``g_bar(group, x)`` reduce-scatters the partial sums [b, s, h] ->
[b, s/t, h] (backward: all-gather). Megatron: ``gather_from_sequence_parallel_region`` /
``reduce_scatter_to_sequence_parallel_region`` in ``megatron/core/tensor_parallel/mappings.py``.
The check runs them in the MLP half of a layer, ``out = x + g_bar(fc2(gelu(fc1(g(LN(x)))))) + b2``.

``sp_block(block, finalize)``: the student writes that block (``block(group, w, x)``, x this rank's
positions) and ``finalize(group, w)``, called after the backward, which must leave every weight's
full gradient: the parameters applied between the TP regions (the layer norm's, fc2's bias) saw
only this rank's positions, so their gradients are partial sums (Megatron tags them
``sequence_parallel`` and all-reduces them over TP in ``finalize_model_grads``).

Both on N gloo ranks in float64; the judge compares with the dense layer (output rows, input
gradient rows, every weight gradient) and the bytes counted on every group: SP's forward sends
what TP's all-reduce sends. labkit's own g and g-bar raise while the student's code runs.
"""
from __future__ import annotations

from . import describe_mismatch, report, sent
from .hints import asker
from .spec import Spec, failed, ranks, run
from .tp_common import ATOL, RTOL
from .compare import far

TP_COMM = "labkit.tensor_parallel.tp_comm"
OWN_SP = tuple(f"{TP_COMM}:{n}" for n in (
    "gather_from_sequence", "reduce_scatter_to_sequence", "_GatherFromSequence.forward",
    "_GatherFromSequence.backward", "_ReduceScatterToSequence.forward", "_ReduceScatterToSequence.backward"))
SP_PARAMS = ("ln_weight", "ln_bias", "fc2_bias")   # applied on this rank's positions only
NAMES = ("ln_weight", "ln_bias", "fc1_weight", "fc1_bias", "fc2_weight", "fc2_bias")


class SPBlock:
    """LN -> g -> fc1 (columns) -> GeLU -> fc2 (rows) -> g-bar -> + bias + residual, on sequence shards."""

    def __init__(self, g, g_bar):
        self.g, self.g_bar = g, g_bar

    def __call__(self, group, w, x):                                # x [b, s/t, h]
        import torch.nn.functional as F
        y = F.layer_norm(x, x.shape[-1:], w["ln_weight"], w["ln_bias"])
        full = self.g(group, y)                                    # [b, s, h]
        a = F.gelu(F.linear(full, w["fc1_weight"], w["fc1_bias"]))   # [b, s, 4h/t]
        z = self.g_bar(group, F.linear(a, w["fc2_weight"]))        # [b, s/t, h]
        return x + z + w["fc2_bias"]


def dense(h: int, seq: int, seed: int):
    """The dense layer's weights, x and dy [2, seq, h] (float64)."""
    import torch
    gen = torch.Generator().manual_seed(seed)
    w = {"ln_weight": 1 + 0.1 * torch.randn(h, generator=gen), "ln_bias": torch.randn(h, generator=gen),
         "fc1_weight": torch.randn(4 * h, h, generator=gen) / h ** 0.5, "fc1_bias": torch.randn(4 * h, generator=gen),
         "fc2_weight": torch.randn(h, 4 * h, generator=gen) / (2 * h ** 0.5), "fc2_bias": torch.randn(h, generator=gen)}
    w = {k: v.double() for k, v in w.items()}
    return w, torch.randn(2, seq, h, generator=gen, dtype=torch.float64), torch.randn(2, seq, h, generator=gen,
                                                                                    dtype=torch.float64)


def _cut(t: int, r: int, h: int) -> dict:
    f = slice(r * 4 * h // t, (r + 1) * 4 * h // t)
    return {"ln_weight": slice(None), "ln_bias": slice(None), "fc1_weight": f, "fc1_bias": f,
            "fc2_weight": (slice(None), f), "fc2_bias": slice(None)}


def _worker(student, h: int, seq: int, seed: int, whole: bool):
    from labkit.groups import world_group

    from . import instrument
    instrument.install()
    objects = student.load()
    group = world_group()
    t, r = group.size, group.rank
    full, x, dy = dense(h, seq, seed)
    cut, pos = _cut(t, r, h), slice(r * seq // t, (r + 1) * seq // t)
    w = {k: full[k][cut[k]].clone().requires_grad_() for k in NAMES}
    xr = x[:, pos].clone().requires_grad_()
    block = objects["block"] if whole else SPBlock(objects["g"], objects["g_bar"])
    before = instrument.snapshot()
    with student.banning(OWN_SP, "g and g-bar are the exercise"):
        out = block(group, w, xr)
        forward = instrument.difference(instrument.snapshot(), before)
        out.backward(dy[:, pos] if out.shape == dy[:, pos].shape else out.detach() * 0 + 1)
        mid = instrument.snapshot()
        if whole:
            objects["finalize"](group, w)
    return {"out": out.detach(), "input grad": xr.grad, **{f"{k} grad": w[k].grad for k in NAMES},
            "forward": forward, "finalize": instrument.difference(instrument.snapshot(), mid)}


def _expected(h, seq, seed, t):
    full, x, dy = dense(h, seq, seed)
    w = {k: v.clone().requires_grad_() for k, v in full.items()}
    xd = x.clone().requires_grad_()
    ref = SPBlock(lambda g, v: v, lambda g, v: v)(None, w, xd)      # the dense layer: t = 1
    ref.backward(dy)
    out = []
    for r in range(t):
        cut, pos = _cut(t, r, h), slice(r * seq // t, (r + 1) * seq // t)
        out.append({"out": ref.detach()[:, pos], "input grad": xd.grad[:, pos],
                    **{f"{k} grad": w[k].grad[cut[k]] for k in NAMES}})
    return out


def _compare(title, data, expected, partial_ok: bool, out_hint: str, grad_hint: str):
    import torch
    for r, out in enumerate(data):
        problem = describe_mismatch(out["out"], expected[r]["out"], ATOL, RTOL, what=f"rank {r}, output: ")
        if problem:
            return report(title, False, problem, out_hint)
    for r, out in enumerate(data):
        for what in ["input grad"] + [f"{k} grad" for k in NAMES]:
            got, want = out[what], expected[r][what]
            if got is None:
                return report(title, False, f"rank {r}, {what}: None", grad_hint)
            if partial_ok and what.split(" ")[0] in SP_PARAMS:
                got = sum(torch.as_tensor(o[what]) for o in data)   # the judge sums the partial ones itself
            problem = describe_mismatch(got, want, ATOL, RTOL, what=f"rank {r}, {what}: ")
            if problem:
                if not partial_ok and what.split(" ")[0] in SP_PARAMS and describe_mismatch(
                        sum(torch.as_tensor(o[what]) for o in data), want, ATOL, RTOL) is None:
                    problem += " (it is a partial sum: summed over the tp ranks it equals the dense gradient)"
                return report(title, False, problem, grad_hint)
    return None


def _forward_bytes(title, data, h, seq, extra_ok=()):
    t, N = len(data), 2 * seq * h * 8
    tp = 2 * (t - 1) / t * N            # TP's forward: one all-reduce of [b, s, h]
    fwd = data[0]["forward"]
    ag, rs = sent(fwd, "all_gather"), sent(fwd, "reduce_scatter")
    if far(ag + rs, tp, 0.5) or set(fwd) - {"all_gather", "reduce_scatter"}:
        ops = ", ".join(f"{op} {v['bytes']:.0f}" for op, v in sorted(fwd.items())) or "nothing"
        return report(title, False, f"right values, but the forward sent {ops} bytes; TP's all-reduce of "
                      f"[b, s, h] sends {tp:.0f}", "one all-gather in g, one reduce-scatter in g-bar, along the "
                      "sequence (dim 1)")
    return None


# -- exercise 1: g and g-bar ---------------------------------------------------------------------------
def _produce_conj(student, world_size=2, hidden_size=8, seq_length=8, seed=0):
    results, failure = ranks(_worker, world_size, student, hidden_size, seq_length, seed, False)
    return failure or results


def _judge_conj(data, world_size=2, hidden_size=8, seq_length=8, seed=0):
    title = f"sp_conjugates g, g-bar ({world_size} ranks)"
    bad = failed(title, data)
    if bad is None:
        bad = _compare(title, data, _expected(hidden_size, seq_length, seed, world_size), True,
                       "the block's output differs from the dense layer's rows for this rank: g must return all s "
                       "positions in rank order, g-bar this rank's s/t positions of the SUM over ranks",
                       "the output is right, some gradients are not: the backward of an operator is its transpose")
    if bad is None:
        bad = _forward_bytes(title, data, hidden_size, seq_length)
    if bad is not None:
        return bad
    t, N = world_size, 2 * seq_length * hidden_size * 8
    return report(title, True, "output rows, input gradient and every weight gradient equal the dense layer "
                  f"(float64, atol {ATOL:g}); the forward sent {(t - 1) / t * N:.0f} + {(t - 1) / t * N:.0f} bytes, "
                  f"TP's all-reduce {2 * (t - 1) / t * N:.0f}: the same")


# -- exercise 2: the whole SP block and its gradient sum ------------------------------------------------
def _produce_block(student, world_size=2, hidden_size=8, seq_length=8, seed=0):
    results, failure = ranks(_worker, world_size, student, hidden_size, seq_length, seed, True)
    return failure or results


def _judge_block(data, world_size=2, hidden_size=8, seq_length=8, seed=0):
    title = f"sp_block ({world_size} ranks)"
    bad = failed(title, data)
    if bad is None:
        bad = _compare(title, data, _expected(hidden_size, seq_length, seed, world_size), False,
                       "the output differs from the dense layer's rows: LN on your positions, g, fc1, GeLU, fc2, "
                       "g-bar, then fc2's bias and the residual, on your positions",
                       "after finalize every gradient must be the full one: which parameters saw only your "
                       "positions?")
    if bad is None:
        bad = _forward_bytes(title, data, hidden_size, seq_length)
    if bad is not None:
        return bad
    h = hidden_size
    want = 2 * (world_size - 1) / world_size * (3 * h) * 8           # ln_weight, ln_bias, fc2_bias
    got = data[0]["finalize"]
    if set(got) - {"all_reduce"} or far(sent(got), want, 0.5):
        ops = ", ".join(f"{op} {v['bytes']:.0f}" for op, v in sorted(got.items())) or "nothing"
        return report(title, False, f"right gradients, but finalize sent {ops} bytes; all-reducing exactly the "
                      f"three partial gradients ({3 * h} numbers) sends {want:.0f}",
                      "only the parameters applied on your positions need the sum; fc1 and fc2's weights are "
                      "already whole on their shard")
    return report(title, True, "output rows, input gradient and every weight gradient after finalize equal the "
                  f"dense layer (float64, atol {ATOL:g}); forward bytes equal TP's; finalize all-reduced the "
                  f"{3 * h} numbers of ln_weight, ln_bias, fc2_bias")


CONJ = Spec("sp-conjugates", {"g": "my_g", "g_bar": "my_g_bar"}, _produce_conj, _judge_conj,
            cases=({"world_size": 2}, {"world_size": 4}), forbid=OWN_SP, ranks=True,
            why="g and g-bar are the exercise", hints=(
                "forward: g turns [b, s/t, h] into [b, s, h]; g-bar sums the ranks' partials and keeps your "
                "s/t positions: which collective does each?",
                "the transpose of 'gather every shard' is 'sum the gradients and keep my shard' (reduce-scatter); "
                "the transpose of 'sum and keep my shard' is 'gather' (all-gather)",
                "g: comm.all_gather(group, x, dim=1), backward comm.reduce_scatter(ctx.group, grad, dim=1); g-bar: "
                "the other way round"))
BLOCK = Spec("sp-block", {"block": "my_sp_mlp", "finalize": "my_sp_finalize"}, _produce_block, _judge_block,
             cases=({"world_size": 2}, {"world_size": 4}), forbid=OWN_SP, ranks=True,
             why="g and g-bar are the exercise", hints=(
                 "write the forward first, with your my_g and my_g_bar: which parts run on your s/t positions "
                 "and which on all s?",
                 "after the backward, a parameter used only on your positions has the gradient of those positions: "
                 "the full gradient is the sum over the tp ranks",
                 "finalize: for k in ('ln_weight', 'ln_bias', 'fc2_bias'): w[k].grad.copy_(comm.all_reduce(group, "
                 "w[k].grad))"))
SPECS = {s.id: s for s in (CONJ, BLOCK)}
hint = asker(SPECS)


def sp_conjugates(g, g_bar, world_size: int = 2, hidden_size: int = 8, seq_length: int = 8, seed: int = 0):
    """Run the SP MLP block with the student's ``g`` and ``g_bar``; print one [check] line."""
    return run(CONJ, {"g": g, "g_bar": g_bar}, world_size=world_size, hidden_size=hidden_size,
               seq_length=seq_length, seed=seed)


def sp_block(block, finalize, world_size: int = 2, hidden_size: int = 8, seq_length: int = 8, seed: int = 0):
    """Run the student's whole SP block and gradient sum; print one [check] line."""
    return run(BLOCK, {"block": block, "finalize": finalize}, world_size=world_size, hidden_size=hidden_size,
               seq_length=seq_length, seed=seed)

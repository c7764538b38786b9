"""Checks for the Tensor-parallel lab: the conjugate operators f and f-bar, RowParallelLinear's
forward, and the vocab-parallel cross-entropy.

Each check runs the student's code on N gloo ranks in float64 against an independent dense
reference (the ``labkit.model`` MLP, the dense linear layer, ``F.cross_entropy`` on the full
logits), compares the forward output, the input gradient and every weight gradient (sharded ones
against the matching slice of the dense gradient), and names the first one that differs, with
what it looks like (e.g. "a partial sum: summed over the tp ranks it equals the dense gradient").
While the student's code runs, labkit's own version of what the exercise asks for raises
(:func:`labkit.check.forbidden`); hints escalate with each failure (:func:`labkit.check.hint`).
``tp_mlp`` (a whole TP MLP, labkit's operators allowed) is what the Troubleshooting page runs.
"""
from __future__ import annotations

from . import describe_mismatch, forbidden, hint, report, run_student

ATOL = RTOL = 1e-10  # float64: only summation order differs
TP_COMM = "labkit.tensor_parallel.tp_comm"
OWN_CONJUGATES = (f"{TP_COMM}:copy_to", f"{TP_COMM}:reduce_from", f"{TP_COMM}:_CopyTo.forward",
                  f"{TP_COMM}:_CopyTo.backward", f"{TP_COMM}:_ReduceFrom.forward",
                  f"{TP_COMM}:_ReduceFrom.backward")
OWN_ROW = ("labkit.tensor_parallel.layers:RowParallelLinear.forward",)
VP = "labkit.tensor_parallel.vocab_parallel"
OWN_VOCAB_LOSS = (f"{VP}:vocab_parallel_cross_entropy", f"{VP}:_VocabParallelCrossEntropy.forward",
                  f"{VP}:VocabParallelCrossEntropyLoss.forward", f"{VP}:cross_entropy_from_parts",
                  f"{VP}:target_logits")


def _dense(h: int, seed: int):
    import torch

    from labkit.model import MLP, GPTConfig
    torch.manual_seed(seed)
    mlp = MLP(GPTConfig(hidden_size=h, num_attention_heads=1)).double()
    with torch.no_grad():  # non-zero biases, so a bias added t times shows
        mlp.linear_fc1.bias.normal_()
        mlp.linear_fc2.bias.normal_()
    x = torch.randn(2, 4, h, dtype=torch.float64)
    dy = torch.randn(2, 4, h, dtype=torch.float64)
    return mlp, x, dy


# -- RowParallelLinear's forward --------------------------------------------------------------
def _row_worker(student_fn, h: int, seed: int):
    import torch

    from labkit.groups import world_group
    from labkit.tensor_parallel.layers import RowParallelLinear

    group = world_group()
    mlp, x, dy = _dense(h, seed)
    dense = mlp.linear_fc2                                  # [h, 4h]: row-parallel in Megatron
    layer = RowParallelLinear.from_dense(dense, group)
    cols = slice(group.rank * 4 * h // group.size, (group.rank + 1) * 4 * h // group.size)
    x = torch.randn(2, 4, 4 * h, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
    xr = x[..., cols].clone().requires_grad_()
    with forbidden(*OWN_ROW, why="its forward is the exercise"):
        y = student_fn(layer, xr)
    stats = group.stats.snapshot()
    if y is None:
        return {"none": True}
    y.backward(dy)
    x.requires_grad_()
    dense(x).backward(dy)
    return {"out": (y.detach(), dense(x).detach()),
            "input grad": (xr.grad, x.grad[..., cols]),
            "weight grad": (layer.weight.grad, dense.weight.grad[:, cols]),
            "bias grad": (layer.bias.grad, dense.bias.grad), "stats": stats,
            "nbytes": y.numel() * 8}


def row_parallel_forward(student_fn, world_size: int = 2, hidden_size: int = 8):
    """``student_fn(layer, x) -> y``: ``layer`` a RowParallelLinear ([out, in/t] weight, replicated
    bias, ``layer.group``), ``x`` [b, s, in/t]; y [b, s, out] replicated, equal to the dense layer."""
    check, name = "row_parallel_forward", f"row_parallel_forward ({world_size} ranks)"
    results, failed = run_student(name, _row_worker, world_size, student_fn, hidden_size, 0,
                                  student_fn=student_fn)
    if failed is not None:
        return failed
    hints = {"out": ["the output differs from the dense layer's: each rank holds only part of the sum",
                     "each rank multiplies its columns, X_r B_r (a partial sum); the ranks' partial sums "
                     "must be added together (an all-reduce), THEN the bias once",
                     "F.linear(x, layer.weight), then tp_comm.reduce_from (f-bar), then + layer.bias"],
             "input grad": ["the output is right, the input gradient is not: look at the backward of the "
                            "operator that sums the partial products",
                            "the gradient arriving at the sum is already replicated: the sum's backward "
                            "is the identity (f-bar = tp_comm.reduce_from), not another all-reduce"],
             "weight grad": "the weight gradient follows from a correct forward through autograd",
             "bias grad": ["the bias gradient is off: the bias is replicated and must be added once",
                           "add the bias after the all-reduce, on the replicated output"]}
    for r, out in enumerate(results):
        if out.get("none"):
            return report(name, False, f"rank {r} returned None", "return the output tensor")
        for what in ("out", "input grad", "weight grad", "bias grad"):
            problem = describe_mismatch(*out[what], ATOL, RTOL, what=f"rank {r}, {what}: ")
            if problem:
                return report(name, False, problem, hint(check, student_fn, hints[what], what))
    n, N = world_size, results[0]["nbytes"]
    sent = results[0]["stats"].get("all_reduce", {}).get("bytes", 0.0)
    ideal = 2 * (n - 1) / n * N
    if abs(sent - ideal) > 0.5:
        return report(name, False, f"rank 0 sent {sent:.0f} bytes in all-reduces, expected one all-reduce "
                      f"of the output: 2(n-1)/n x {N} = {ideal:.0f}",
                      hint(check, student_fn, "one tp_comm.reduce_from on the [b, s, out] partial sum, "
                           "nothing else", "bytes"))
    return report(name, True, f"output, input, weight and bias gradients equal the dense layer "
                  f"(float64, atol {ATOL:g}); one all-reduce of {ideal:.0f} bytes per rank")


# -- the TP MLP: f and f-bar -------------------------------------------------------------------
def _mlp_worker(student_fn, h: int, seed: int, forbid: tuple):
    import torch
    import torch.distributed as dist

    from labkit.comm import all_reduce
    from labkit.groups import world_group

    group = world_group()
    t, r = group.size, group.rank
    mlp, x, dy = _dense(h, seed)
    f = 4 * h // t
    rows, cols = slice(r * f, (r + 1) * f), slice(r * f, (r + 1) * f)
    shard = {"fc1_weight": mlp.linear_fc1.weight[rows], "fc1_bias": mlp.linear_fc1.bias[rows],
             "fc2_weight": mlp.linear_fc2.weight[:, cols], "fc2_bias": mlp.linear_fc2.bias}
    shard = {k: v.detach().clone().requires_grad_() for k, v in shard.items()}
    xr = x.clone().requires_grad_()
    with forbidden(*forbid, why="the operators are the exercise"):
        y = student_fn(group, shard, xr)
        y.backward(dy)
    xd = x.clone().requires_grad_()
    mlp(xd).backward(dy)
    dense = {"fc1_weight": mlp.linear_fc1.weight.grad[rows], "fc1_bias": mlp.linear_fc1.bias.grad[rows],
             "fc2_weight": mlp.linear_fc2.weight.grad[:, cols], "fc2_bias": mlp.linear_fc2.bias.grad}
    # what a partial (un-reduced) input gradient would sum to, to name the bug precisely
    summed = all_reduce(world_group(), xr.grad) if dist.get_world_size() > 1 else xr.grad
    return {"out": (y.detach(), mlp(x).detach()), "input grad": (xr.grad, xd.grad),
            "input grad summed": (summed, xd.grad),
            **{f"{k} grad": (shard[k].grad, dense[k]) for k in shard}}


def _judge_mlp(name, results, t, hints):
    """Compare a TP MLP's output and gradients with the dense MLP; ``hints(kind)`` -> hint text."""
    order = ["input grad", "fc1_weight grad", "fc1_bias grad", "fc2_weight grad", "fc2_bias grad"]
    for r, out in enumerate(results):
        problem = describe_mismatch(*out["out"], ATOL, RTOL, what=f"rank {r}, forward output: ")
        if problem:
            return report(name, False, problem, hints("forward"))
    wrong, kinds = [], set()
    for what in order:  # every gradient, so the message says which are wrong and how
        got, expected = results[0][what]
        if describe_mismatch(got, expected, ATOL, RTOL) is None:
            continue
        if describe_mismatch(got, t * expected, ATOL, RTOL) is None:
            wrong.append(f"{what} = {t} x the dense gradient")
            kinds.add("times t")
        elif what == "input grad" and describe_mismatch(*results[0]["input grad summed"], ATOL, RTOL) is None:
            wrong.append(f"{what} is a partial sum (summed over the {t} ranks it equals the dense one)")
            kinds.add("partial")
        else:
            wrong.append(describe_mismatch(got, expected, ATOL, RTOL, what=f"{what}: "))
    if wrong:
        kind = "times t" if kinds == {"times t"} else "partial" if kinds == {"partial"} else "other"
        return report(name, False, "forward output is right; rank 0: " + "; ".join(wrong), hints(kind))
    return None


TP_MLP_HINTS = {
    "forward": "f before linear_fc1, f-bar after linear_fc2, the bias of linear_fc2 added once after f-bar",
    "times t": "a backward summed t copies of an already replicated gradient: the all-reduce LEAVING the "
               "TP region must have an identity backward, f-bar = tp_comm.reduce_from "
               "(torch.distributed.nn.functional.all_reduce all-reduces in the backward too)",
    "partial": "the operator ENTERING the TP region must be f = tp_comm.copy_to (identity forward, "
               "all-reduce backward), the conjugate of f-bar = tp_comm.reduce_from",
    "other": "compare each operator's forward AND backward with the table in "
             "labkit/tensor_parallel/tp_comm.py"}


def tp_mlp(student_fn, world_size: int = 2, hidden_size: int = 8):
    """``student_fn(group, shard, x) -> y``: a TP MLP on this rank's shard (``fc1_weight`` [4h/t, h],
    ``fc1_bias`` [4h/t], ``fc2_weight`` [h, 4h/t], ``fc2_bias`` [h]); x, y replicated [b, s, h].
    labkit's operators are allowed here (the Troubleshooting page's example)."""
    name = f"tp_mlp ({world_size} ranks)"
    results, failed = run_student(name, _mlp_worker, world_size, student_fn, hidden_size, 0, (),
                                  student_fn=student_fn)
    if failed is not None:
        return failed
    failed = _judge_mlp(name, results, world_size, TP_MLP_HINTS.get)
    if failed is not None:
        return failed
    return report(name, True, "output, input gradient and all four weight/bias gradients equal the "
                  f"dense MLP on every rank (float64, atol {ATOL:g})")


class _MLPWith:
    """A TP MLP made of the student's f and f-bar (picklable, so it travels to the ranks)."""

    def __init__(self, f, f_bar):
        self.f, self.f_bar = f, f_bar
        self.__qualname__ = f"{getattr(f, '__qualname__', 'f')}+{getattr(f_bar, '__qualname__', 'f_bar')}"

    def __call__(self, group, shard, x):
        import torch.nn.functional as F
        x = self.f(group, x)                                               # f: enter the region
        y = F.gelu(F.linear(x, shard["fc1_weight"], shard["fc1_bias"]))    # [b, s, 4h/t]
        z = self.f_bar(group, F.linear(y, shard["fc2_weight"]))            # f-bar: sum the partials
        return z + shard["fc2_bias"]


def conjugates(f, f_bar, world_size: int = 2, hidden_size: int = 8):
    """``f(group, x)`` (identity forward, all-reduce backward) and ``f_bar(group, x)`` (all-reduce
    forward, identity backward), run in a TP MLP (fc1 by columns, fc2 by rows) against the dense MLP."""
    check, name = "conjugates", f"conjugates f, f-bar ({world_size} ranks)"
    student = _MLPWith(f, f_bar)
    results, failed = run_student(name, _mlp_worker, world_size, student, hidden_size, 0, OWN_CONJUGATES,
                                  student_fn=student)
    if failed is not None:
        return failed
    levels = {
        "forward": ["the forward output differs from the dense MLP's",
                    "f must hand x through unchanged; f-bar must return the SUM over ranks of the "
                    "partial products (comm.all_reduce)"],
        "times t": ["the gradients upstream of f-bar are t times too large",
                    "the gradient reaching f-bar is already the same on every rank: f-bar's backward "
                    "must return it unchanged (a sum's backward is a copy)"],
        "partial": ["the input gradient is only this rank's share",
                    "x is used by every rank's weight shard: f's backward must SUM the ranks' "
                    "gradients (comm.all_reduce)"],
        "other": ["some gradients differ from the dense MLP's",
                  "check each backward: f's is an all-reduce, f-bar's the identity"]}
    failed = _judge_mlp(name, results, world_size, lambda kind: hint(check, student, levels[kind], kind))
    if failed is not None:
        return failed
    return report(name, True, "your f and f-bar give the dense MLP's output, input gradient and all "
                  f"four weight/bias gradients on every rank (float64, atol {ATOL:g})")


# -- the vocab-parallel cross-entropy ----------------------------------------------------------
def _vocab_worker(student_fn, vocab: int, seed: int):
    import torch
    import torch.nn.functional as F

    from labkit.groups import world_group

    group = world_group()
    t, r = group.size, group.rank
    gen = torch.Generator().manual_seed(seed)
    logits = 3 * torch.randn(2, 6, vocab, generator=gen, dtype=torch.float64)
    logits[1] += 800.0                      # large logits: exp() overflows unless the max is subtracted
    labels = torch.randint(0, vocab, (2, 6), generator=gen)
    per = vocab // t
    shard = logits[..., r * per:(r + 1) * per].clone()
    with forbidden(*OWN_VOCAB_LOSS, why="the vocab-parallel loss is the exercise"):
        got = student_fn(group, shard, labels, r * per)
    sent = sum(v for k, v in group.stats.bytes.items())
    expected = F.cross_entropy(logits.transpose(1, 2), labels, reduction="none")   # [b, s]
    return {"got": None if got is None else torch.as_tensor(got).detach(), "expected": expected,
            "sent": sent, "logit_bytes": logits.numel() * 8}


def vocab_parallel_loss(student_fn, world_size: int = 2, vocab_size: int = 16):
    """``student_fn(group, logits, labels, vocab_start) -> loss [b, s]``: ``logits`` [b, s, V/t] are
    this rank's vocabulary rows [vocab_start, vocab_start + V/t); ``labels`` [b, s] are global ids.
    Compared with ``F.cross_entropy`` on the full logits (reduction "none")."""
    check, name = "vocab_parallel_loss", f"vocab_parallel_loss ({world_size} ranks)"
    results, failed = run_student(name, _vocab_worker, world_size, student_fn, vocab_size, 0,
                                  student_fn=student_fn)
    if failed is not None:
        return failed
    import torch
    for r, out in enumerate(results):
        if out["got"] is None:
            return report(name, False, f"rank {r} returned None", "return the per-token loss [b, s]")
        if out["got"].shape == out["expected"].shape and not bool(torch.isfinite(out["got"]).all()):
            return report(name, False, f"rank {r}: the loss is inf or nan where the logits are large "
                          "(about 800)", hint(check, student_fn, [
                              "exp(800) overflows: the softmax must be computed stably",
                              "subtract the maximum logit of each position (the max over ALL ranks' "
                              "shards) before exp()"], "overflow"))
        problem = describe_mismatch(out["got"], out["expected"], 1e-9, 1e-9, what=f"rank {r}, loss ")
        if problem:
            return report(name, False, problem, hint(check, student_fn, [
                "the per-token loss differs from F.cross_entropy on the full logits",
                "loss = log(sum_j exp(z_j - m)) - (z_label - m) with m the GLOBAL max; every sum over "
                "the vocabulary is a sum over ranks of local sums",
                "three collectives on [b, s] tensors: the max (all-gather the local maxima), the "
                "label's logit (zero where this rank does not own the label, then all-reduce), the "
                "sum of exp (all-reduce)"], "values"))
    b_s = results[0]["expected"].numel()
    bound = 8 * b_s * (world_size + 4)        # all-gather of t maxima + 2 ring all-reduces, in bytes
    if results[0]["sent"] > bound:
        return report(name, False, f"right values, but rank 0 sent {results[0]['sent']:.0f} bytes; three "
                      f"[b, s] collectives send at most {bound}; the logits are {results[0]['logit_bytes']} "
                      "bytes", hint(check, student_fn, "never move the logits: exchange only per-position "
                                    "numbers (max, label logit, sum of exp)", "bytes"))
    return report(name, True, f"per-token loss equals F.cross_entropy on the full [b, s, V] logits "
                  f"(float64, tol 1e-9, logits up to 800 included); rank 0 sent {results[0]['sent']:.0f} "
                  f"bytes, the logits never moved")

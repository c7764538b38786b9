"""Checks for the Tensor-parallel lab: the conjugate operators f and f-bar, a whole TP attention
block (``tp_blocks.py``), and the vocab-parallel cross-entropy (``tp_blocks.py``).

Each check runs the student's code on N gloo ranks in float64 and compares, in the judge, with an
independent dense reference built there (the ``labkit.model`` MLP and attention, ``F.cross_entropy``
on the full logits): the forward output, the input gradient and every weight gradient (sharded
ones against the matching slice of the dense gradient), naming the first that differs and what
it looks like ("a partial sum: summed over the tp ranks it equals the dense gradient"), and the
bytes every rank sent on any group (:mod:`labkit.check.instrument`). ``tp_mlp`` (a whole TP MLP,
labkit's operators allowed) is what the Troubleshooting page runs.
"""
from __future__ import annotations

from . import report, tp_blocks
from .spec import Spec, failed, ranks, run
from .compare import far
from .tp_common import (ATOL, GRADS, OWN_CONJUGATES, RTOL, MLPWith, _mlp_shard,  # noqa: F401 - the lab's names
                        dense_mlp, judge_mlp)

def _mlp_worker(student, h: int, seed: int, forbid: tuple, make):
    from labkit.groups import world_group

    from . import instrument
    instrument.install()
    objects = student.load()
    group = world_group()
    mlp, x, dy = dense_mlp(h, seed)
    shard = {k: v.detach().clone().requires_grad_() for k, v in _mlp_shard(mlp, group.size, group.rank).items()}
    xr = x.clone().requires_grad_()
    before = instrument.snapshot()
    with student.banning(forbid):
        y = make(objects)(group, shard, xr)
        y.backward(dy)
    return {"out": y.detach(), "input grad": xr.grad,
            **{f"{k} grad": shard[k].grad for k in GRADS},
            "counts": instrument.difference(instrument.snapshot(), before)}


def _from_conjugates(objects):
    return MLPWith(objects["f"], objects["f_bar"])


def _from_mlp(objects):
    return objects["mlp"]


def _mlp_expected(h: int, seed: int, t: int) -> list[dict]:
    mlp, x, dy = dense_mlp(h, seed)
    xd = x.clone().requires_grad_()
    y = mlp(xd)
    y.backward(dy)
    grads = {"fc1_weight": mlp.linear_fc1.weight.grad, "fc1_bias": mlp.linear_fc1.bias.grad,
             "fc2_weight": mlp.linear_fc2.weight.grad, "fc2_bias": mlp.linear_fc2.bias.grad}
    out = []
    for r in range(t):
        f = mlp.linear_fc1.weight.shape[0] // t
        rows = slice(r * f, (r + 1) * f)
        cut = {"fc1_weight": grads["fc1_weight"][rows], "fc1_bias": grads["fc1_bias"][rows],
               "fc2_weight": grads["fc2_weight"][:, rows], "fc2_bias": grads["fc2_bias"]}
        out.append({"out": y.detach(), "input grad": xd.grad, **{f"{k} grad": cut[k] for k in GRADS}})
    return out


def _all_reduce_bytes(title, results, n_all_reduces: int, nbytes: int, hint: str):
    t = len(results)
    ideal = n_all_reduces * 2 * (t - 1) / t * nbytes
    for r, out in enumerate(results):
        others = [op for op in out["counts"] if op != "all_reduce"]
        got = out["counts"].get("all_reduce", {}).get("bytes", 0.0)
        if others or far(got, ideal, 0.5):
            what = ", ".join(f"{op} {v['bytes']:.0f}" for op, v in sorted(out["counts"].items())) or "nothing"
            return report(title, False, f"right values, but rank {r} sent {what} bytes; {n_all_reduces} "
                          f"all-reduce(s) of the [b, s, h] output send {ideal:.0f}", hint)
    return None


# -- exercise 1: f and f-bar ----------------------------------------------------------------------
CONJUGATE_DIAGNOSIS = {
    "forward": "the forward output differs from the dense MLP's: f must hand x through unchanged, f-bar "
               "must return the SUM over ranks of the partial products",
    "times t": "the gradients upstream of f-bar are t times too large: the gradient reaching f-bar is already "
               "the same on every rank",
    "partial": "the input gradient is only this rank's share: x fed every rank's weight shard",
    "other": "some gradients differ from the dense MLP's: compare each backward with its forward's transpose"}


def _produce_conjugates(student, world_size=2, hidden_size=8, seed=0):
    results, failure = ranks(_mlp_worker, world_size, student, hidden_size, seed, OWN_CONJUGATES,
                             _from_conjugates)
    return failure or results


def _judge_conjugates(data, world_size=2, hidden_size=8, seed=0):
    title = f"conjugates f, f-bar ({world_size} ranks)"
    bad = failed(title, data)
    if bad is not None:
        return bad
    bad = judge_mlp(title, data, _mlp_expected(hidden_size, seed, world_size), world_size, CONJUGATE_DIAGNOSIS)
    if bad is not None:
        return bad
    bad = _all_reduce_bytes(title, data, 2, 2 * 4 * hidden_size * 8,
                            "one all-reduce in f-bar's forward and one in f's backward, nothing else")
    if bad is not None:
        return bad
    return report(title, True, "your f and f-bar give the dense MLP's output, input gradient and all "
                  f"four weight/bias gradients on every rank (float64, atol {ATOL:g}); one all-reduce "
                  "forward, one backward")


CONJUGATES = Spec(
    "conjugates", {"f": "my_f", "f_bar": "my_f_bar"}, _produce_conjugates, _judge_conjugates,
    cases=({"world_size": 2}, {"world_size": 4}), forbid=OWN_CONJUGATES, ranks=True,
    why="the operators are the exercise", hints=(
        "forward first: which operator must change nothing, and which must sum the ranks' partial products?",
        "the backward of an operator is its transpose: the transpose of 'copy x to every rank' is 'sum the "
        "ranks' gradients', the transpose of 'sum' is 'copy'",
        "f: forward x.view_as(x), backward comm.all_reduce(ctx.group, grad); f-bar: forward "
        "comm.all_reduce(group, x), backward the identity (return None, grad)"))


def conjugates(f, f_bar, world_size: int = 2, hidden_size: int = 8, seed: int = 0):
    """``f(group, x)`` (identity forward, all-reduce backward) and ``f_bar(group, x)`` (all-reduce
    forward, identity backward), run in a TP MLP (fc1 by columns, fc2 by rows) against the dense MLP."""
    return run(CONJUGATES, {"f": f, "f_bar": f_bar}, world_size=world_size, hidden_size=hidden_size, seed=seed)


# -- the Troubleshooting page's whole TP MLP (labkit's operators allowed; not graded) -------------
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
    from . import wire
    from .spec import Live
    title = f"tp_mlp ({world_size} ranks)"
    results, failure = ranks(_mlp_worker, world_size, Live({"mlp": student_fn}), hidden_size, 0, (), _from_mlp)
    data = wire.loads(wire.dumps(failure or results))
    bad = failed(title, data)
    if bad is None:
        bad = judge_mlp(title, data, _mlp_expected(hidden_size, 0, world_size), world_size, TP_MLP_HINTS)
    if bad is not None:
        return bad
    return report(title, True, "output, input gradient and all four weight/bias gradients equal the "
                  f"dense MLP on every rank (float64, atol {ATOL:g})")


# -- the lab's exercises, and hints on request -----------------------------------------------------
SPECS = {s.id: s for s in (CONJUGATES, tp_blocks.ATTENTION, tp_blocks.VOCAB_CE)}
tp_attention, vocab_parallel_loss = tp_blocks.tp_attention, tp_blocks.vocab_parallel_loss


def hint(exercise_id: str) -> str:
    """Print the next hint of ``exercise_id`` ("conjugates", "tp-attention", "vocab-parallel-ce")."""
    from .hints import asker
    return asker(SPECS)(exercise_id)

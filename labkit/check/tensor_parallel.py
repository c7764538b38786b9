"""Checks for the Tensor-parallel lab: a RowParallelLinear forward, and a TP MLP with a planted bug.

Each check runs the student's function on N gloo ranks in float64 against the dense
``labkit.model`` layer (an independent code path), compares the forward output, the input gradient
and every weight gradient (sharded ones against the matching slice of the dense gradient), and
names the first one that differs, with what it looks like (e.g. "a partial sum: summed over the
tp ranks it equals the dense gradient").
"""
from __future__ import annotations

from . import describe_mismatch, report, run_student

ATOL = RTOL = 1e-10  # float64: only summation order differs


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
    name = f"row_parallel_forward ({world_size} ranks)"
    results, failed = run_student(name, _row_worker, world_size, student_fn, hidden_size, 0)
    if failed is not None:
        return failed
    hints = {"out": "each rank multiplies its columns X_r B_r (a partial sum), all ranks sum them "
                    "(tp_comm.reduce_from), THEN the bias is added once",
             "input grad": "use labkit.tensor_parallel.tp_comm.reduce_from (f-bar): all-reduce forward, "
                           "identity backward",
             "weight grad": "the weight gradient follows from a correct forward through autograd",
             "bias grad": "add the bias after the all-reduce, on the replicated output"}
    for r, out in enumerate(results):
        if out.get("none"):
            return report(name, False, f"rank {r} returned None", "return the output tensor")
        for what in ("out", "input grad", "weight grad", "bias grad"):
            problem = describe_mismatch(*out[what], ATOL, RTOL, what=f"rank {r}, {what}: ")
            if problem:
                return report(name, False, problem, hints[what])
    n, N = world_size, results[0]["nbytes"]
    sent = results[0]["stats"].get("all_reduce", {}).get("bytes", 0.0)
    ideal = 2 * (n - 1) / n * N
    if abs(sent - ideal) > 0.5:
        return report(name, False, f"rank 0 sent {sent:.0f} bytes in all-reduces, expected one all-reduce "
                      f"of the output: 2(n-1)/n x {N} = {ideal:.0f}",
                      "one tp_comm.reduce_from on the [b, s, out] partial sum, nothing else")
    return report(name, True, f"output, input, weight and bias gradients equal the dense layer "
                  f"(float64, atol {ATOL:g}); one all-reduce of {ideal:.0f} bytes per rank")


# ---------------------------------------------------------------------------------------------
def _mlp_worker(student_fn, h: int, seed: int):
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


def tp_mlp(student_fn, world_size: int = 2, hidden_size: int = 8):
    """``student_fn(group, shard, x) -> y``: a TP MLP on this rank's shard (``fc1_weight`` [4h/t, h],
    ``fc1_bias`` [4h/t], ``fc2_weight`` [h, 4h/t], ``fc2_bias`` [h]); x, y replicated [b, s, h]."""
    name = f"tp_mlp ({world_size} ranks)"
    results, failed = run_student(name, _mlp_worker, world_size, student_fn, hidden_size, 0)
    if failed is not None:
        return failed
    order = ["input grad", "fc1_weight grad", "fc1_bias grad", "fc2_weight grad", "fc2_bias grad"]
    t = world_size
    for r, out in enumerate(results):
        problem = describe_mismatch(*out["out"], ATOL, RTOL, what=f"rank {r}, forward output: ")
        if problem:
            return report(name, False, problem, "f before linear_fc1, g after linear_fc2, the bias "
                          "of linear_fc2 added once after g")
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
        if kinds == {"times t"}:
            hint = ("a backward summed t copies of an already replicated gradient: the all-reduce "
                    "LEAVING the TP region must have an identity backward, f-bar = tp_comm.reduce_from "
                    "(torch.distributed.nn.functional.all_reduce all-reduces in the backward too)")
        elif kinds == {"partial"}:
            hint = ("the operator ENTERING the TP region must be f = tp_comm.copy_to (identity "
                    "forward, all-reduce backward), the conjugate of f-bar = tp_comm.reduce_from")
        else:
            hint = ("compare each operator's forward AND backward with the table in "
                    "labkit/tensor_parallel/tp_comm.py")
        return report(name, False, "forward output is right; rank 0: " + "; ".join(wrong), hint)
    return report(name, True, "output, input gradient and all four weight/bias gradients equal the "
                  f"dense MLP on every rank (float64, atol {ATOL:g})")

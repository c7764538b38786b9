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
    from labkit.tensor_parallel import RowParallelLinear

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
                    "(comm.reduce_from), THEN the bias is added once",
             "input grad": "use labkit.comm.reduce_from (g): all-reduce forward, identity backward",
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
                      "one comm.reduce_from on the [b, s, out] partial sum, nothing else")
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
                    "LEAVING the TP region must have an identity backward, g = comm.reduce_from "
                    "(torch.distributed.nn.functional.all_reduce all-reduces in the backward too)")
        elif kinds == {"partial"}:
            hint = ("the operator ENTERING the TP region must be f = comm.copy_to (identity "
                    "forward, all-reduce backward), the conjugate of g = comm.reduce_from")
        else:
            hint = "compare each operator's forward AND backward with the table in labkit/comm.py"
        return report(name, False, "forward output is right; rank 0: " + "; ".join(wrong), hint)
    return report(name, True, "output, input gradient and all four weight/bias gradients equal the "
                  f"dense MLP on every rank (float64, atol {ATOL:g})")


# ---------------------------------------------------------------------------------------------
# The lab's (and the tests') measurement: one transformer layer, dense vs cut, on t ranks
# ---------------------------------------------------------------------------------------------
def _shard_of(name: str, dense_grad, r: int, t: int):
    """The slice of a dense gradient that tp rank r holds (column-parallel: rows; row-parallel
    weights: columns; everything else replicated)."""
    if "linear_qkv" in name or "linear_fc1" in name:
        return dense_grad.chunk(t, dim=0)[r]
    if name.endswith(("linear_proj.weight", "linear_fc2.weight")):
        return dense_grad.chunk(t, dim=1)[r]
    return dense_grad


def _block_worker(sequence_parallel: bool, dtype: str, cfg_kw: dict, micro_batch_size: int, seed: int,
                  regather: bool = False):
    import copy

    import torch

    from labkit.groups import world_group
    from labkit.launcher import device
    from labkit.model import GPTConfig, TransformerLayer
    from labkit.parallelize import all_reduce_sequence_parallel_grads
    from labkit.sequence_parallel import mark_sequence_parallel, saved_activations, use_regather
    from labkit.tensor_parallel import ParallelAttention, ParallelMLP

    group, dev, dt = world_group(), device(), getattr(torch, dtype)
    t, r = group.size, group.rank
    cfg = GPTConfig(**cfg_kw)
    gen = torch.Generator().manual_seed(seed)
    dense = TransformerLayer(cfg).to(dt)
    with torch.no_grad():  # every parameter random, biases and norms included, so none hides a bug
        for p in dense.parameters():
            p.copy_(torch.randn(p.shape, generator=gen, dtype=dt) * 0.2 + (p.dim() == 1) * 0.5)
    dense = dense.to(dev)
    cut = copy.deepcopy(dense)
    cut.self_attention = ParallelAttention.from_dense(cut.self_attention, group, sequence_parallel)
    cut.mlp = ParallelMLP.from_dense(cut.mlp, group, sequence_parallel)
    if sequence_parallel:
        mark_sequence_parallel(cut)
    if regather:
        use_regather(cut)
    b, s, h = micro_batch_size, cfg.seq_length, cfg.hidden_size
    x = torch.randn(b, s, h, generator=gen, dtype=dt).to(dev).requires_grad_()
    dy = torch.randn(b, s, h, generator=gen, dtype=dt).to(dev)
    dense(x).backward(dy)
    lo, hi = (r * s // t, (r + 1) * s // t) if sequence_parallel and t > 1 else (0, s)
    xr = x.detach()[:, lo:hi].clone().requires_grad_()     # [b, s/t, h] under SP, else [b, s, h]
    saved, y = saved_activations(cut, xr, exclude=list(cut.parameters()))
    y.backward(dy[:, lo:hi])
    comm_fwd_bwd = group.stats.snapshot()                  # the layer's own traffic
    all_reduce_sequence_parallel_grads(cut, group)         # what the Engine does after backward
    pairs = {"output": (y, dense(x)[:, lo:hi]), "input grad": (xr.grad, x.grad[:, lo:hi])}
    dense_grads = dict(dense.named_parameters())
    for name, p in cut.named_parameters():
        pairs[name + " grad"] = (p.grad, _shard_of(name, dense_grads[name].grad, r, t))
    return {"pairs": {k: (a.detach().cpu(), e.detach().cpu()) for k, (a, e) in pairs.items()},
            "comm": comm_fwd_bwd, "saved_bytes": saved.total_bytes, "saved": saved.table()}


def block_parity(tp: int, sequence_parallel: bool = False, dtype: str = "float64", seq_length: int = 16,
                 hidden_size: int = 32, num_attention_heads: int = 4, micro_batch_size: int = 2,
                 seed: int = 0, backend: str = "auto", regather: bool = False) -> list[dict]:
    """Run one TransformerLayer dense and cut over ``tp`` ranks; per rank (rank order): ``pairs``
    {what: (tp value, dense value)} for the output, the input gradient and every parameter's
    gradient (the matching dense slice), ``comm`` (bytes and calls of the forward + backward) and
    the activations saved for the backward (``saved_bytes``, ``saved`` [(bytes, shape)]).
    ``regather``: SP with Megatron's re-gathering GEMMs (``labkit.sequence_parallel.use_regather``)."""
    from labkit.launcher import launch
    cfg_kw = dict(num_layers=1, hidden_size=hidden_size, num_attention_heads=num_attention_heads,
                  seq_length=seq_length, vocab_size=256)
    return launch(_block_worker, tp, sequence_parallel, dtype, cfg_kw, micro_batch_size, seed, regather,
                  backend=backend, timeout=120.0)

"""Check for the Sequence-parallel lab: the conjugate pair g / g-bar (Korthikanti et al. 2022, Sec. 4.2.2).

``g(group, x)``: all-gather the sequence shards [b, s/t, h] -> [b, s, h] in the forward,
reduce-scatter the gradient in the backward. ``g_bar(group, x)``: reduce-scatter the partial sums
[b, s, h] -> [b, s/t, h] in the forward, all-gather the gradient in the backward. (Megatron:
``gather_from_sequence_parallel_region`` / ``reduce_scatter_to_sequence_parallel_region`` in
``megatron/core/tensor_parallel/mappings.py``.)

The check builds the MLP half of a transformer layer under TP + SP on N gloo ranks, in float64:
rank r holds positions [r s/t, (r+1) s/t) of the input, ``out = x + g_bar(fc2(gelu(fc1(g(LN(x))))))
+ b2`` with fc1 cut by columns and fc2 by rows, and compares with the dense layer: the output
rows, the input-gradient rows, every weight gradient (the layer norm's and fc2's bias summed over
the TP ranks first, as Megatron's ``finalize_model_grads`` does for ``sequence_parallel``
parameters), and the bytes: SP must send what TP's all-reduces send. labkit's own g and g-bar
(``labkit.tensor_parallel.tp_comm``) raise while the student's code runs.
"""
from __future__ import annotations

from . import describe_mismatch, forbidden, hint, report, run_student
from .tensor_parallel import ATOL, RTOL

TP_COMM = "labkit.tensor_parallel.tp_comm"
OWN_SP = tuple(f"{TP_COMM}:{n}" for n in (
    "gather_from_sequence", "reduce_scatter_to_sequence", "_GatherFromSequence.forward",
    "_GatherFromSequence.backward", "_ReduceScatterToSequence.forward", "_ReduceScatterToSequence.backward"))


class _SPBlock:
    """LN -> g -> fc1 (columns) -> GeLU -> fc2 (rows) -> g-bar -> + bias + residual, on sequence shards."""

    def __init__(self, g, g_bar):
        self.g, self.g_bar = g, g_bar
        self.__qualname__ = f"{getattr(g, '__qualname__', 'g')}+{getattr(g_bar, '__qualname__', 'g_bar')}"

    def __call__(self, group, w, x):                                # x [b, s/t, h]
        import torch.nn.functional as F
        y = F.layer_norm(x, x.shape[-1:], w["ln_weight"], w["ln_bias"])
        full = self.g(group, y)                                    # [b, s, h]
        a = F.gelu(F.linear(full, w["fc1_weight"], w["fc1_bias"]))   # [b, s, 4h/t]
        z = self.g_bar(group, F.linear(a, w["fc2_weight"]))        # [b, s/t, h]
        return x + z + w["fc2_bias"]


def _worker(block, h: int, seq: int, seed: int):
    import torch
    import torch.nn.functional as F

    from labkit import comm
    from labkit.groups import world_group

    group = world_group()
    t, r = group.size, group.rank
    gen = torch.Generator().manual_seed(seed)
    dense = {"ln_weight": 1 + 0.1 * torch.randn(h, generator=gen), "ln_bias": torch.randn(h, generator=gen),
             "fc1_weight": torch.randn(4 * h, h, generator=gen) / h ** 0.5,
             "fc1_bias": torch.randn(4 * h, generator=gen),
             "fc2_weight": torch.randn(h, 4 * h, generator=gen) / (2 * h ** 0.5),
             "fc2_bias": torch.randn(h, generator=gen)}
    dense = {k: v.double().requires_grad_() for k, v in dense.items()}
    x = torch.randn(2, seq, h, generator=gen, dtype=torch.float64)
    dy = torch.randn(2, seq, h, generator=gen, dtype=torch.float64)
    f, pos = 4 * h // t, slice(r * seq // t, (r + 1) * seq // t)
    cut = {"ln_weight": slice(None), "ln_bias": slice(None), "fc1_weight": slice(r * f, (r + 1) * f),
           "fc1_bias": slice(r * f, (r + 1) * f), "fc2_weight": (slice(None), slice(r * f, (r + 1) * f)),
           "fc2_bias": slice(None)}
    w = {k: dense[k].detach()[cut[k]].clone().requires_grad_() for k in dense}
    xr = x[:, pos].clone().requires_grad_()
    with forbidden(*OWN_SP, why="g and g-bar are the exercise"):
        out = block(group, w, xr)
        stats = group.stats.snapshot()
        out.backward(dy[:, pos] if out.shape == dy[:, pos].shape else torch.ones_like(out))
    xd = x.clone().requires_grad_()
    ref = _SPBlock(lambda g, v: v, lambda g, v: v)(None, dense, xd)   # the dense layer: t = 1
    ref.backward(dy)
    # parameters that saw only this rank's positions hold partial gradients: sum them over tp
    grads = {k: (comm.all_reduce(world_group(), w[k].grad) if k in ("ln_weight", "ln_bias", "fc2_bias")
                 and w[k].grad is not None else w[k].grad) for k in w}
    return {"out": (out.detach(), ref.detach()[:, pos]), "input grad": (xr.grad, xd.grad[:, pos]),
            **{f"{k} grad": (grads[k], dense[k].grad[cut[k]]) for k in w},
            "stats": stats, "act_bytes": x.numel() * 8}


def sp_conjugates(g, g_bar, world_size: int = 2, hidden_size: int = 8, seq_length: int = 8):
    """Run the SP MLP block with the student's ``g`` and ``g_bar``; print one [check] line."""
    check, name = "sp_conjugates", f"sp_conjugates g, g-bar ({world_size} ranks)"
    block = _SPBlock(g, g_bar)
    results, failed = run_student(name, _worker, world_size, block, hidden_size, seq_length, 0,
                                  student_fn=block)
    if failed is not None:
        return failed
    levels = {
        "out": ["the block's output differs from the dense layer's rows for this rank",
                "g must return all s positions in rank order (every rank's shard, concatenated along "
                "the sequence, dim 1); g-bar must return this rank's s/t positions of the SUM over ranks",
                "g: comm.all_gather(group, x, dim=1); g-bar: comm.reduce_scatter(group, x, dim=1)"],
        "grads": ["the output is right, some gradients are not: look at the backwards",
                  "the transpose of 'gather every shard' is 'sum the gradients and keep my shard' "
                  "(reduce-scatter); the transpose of 'sum and keep my shard' is 'gather' (all-gather)",
                  "g.backward: comm.reduce_scatter(ctx.group, grad, dim=1); g-bar.backward: "
                  "comm.all_gather(ctx.group, grad, dim=1)"]}
    for r, out in enumerate(results):
        problem = describe_mismatch(*out["out"], ATOL, RTOL, what=f"rank {r}, output: ")
        if problem:
            return report(name, False, problem, hint(check, block, levels["out"], "out"))
    for r, out in enumerate(results):
        for what in ["input grad"] + [k for k in out if k.endswith(" grad") and k != "input grad"]:
            got, expected = out[what]
            if got is None:
                return report(name, False, f"rank {r}, {what}: None", hint(check, block, levels["grads"], "grads"))
            problem = describe_mismatch(got, expected, ATOL, RTOL, what=f"rank {r}, {what}: ")
            if problem:
                return report(name, False, problem, hint(check, block, levels["grads"], "grads"))
    n, N = world_size, results[0]["act_bytes"]
    stats = results[0]["stats"]
    ag, rs = (stats.get(op, {}).get("bytes", 0.0) for op in ("all_gather", "reduce_scatter"))
    tp_bytes = 2 * (n - 1) / n * N            # TP's forward: one all-reduce of [b, s, h]
    if abs(ag + rs - tp_bytes) > 0.5 or stats.get("all_reduce"):
        return report(name, False, f"right values, but the forward sent all-gather {ag:.0f} + "
                      f"reduce-scatter {rs:.0f} bytes (and {stats.get('all_reduce', {}).get('bytes', 0):.0f} "
                      f"in all-reduces); TP's all-reduce of [b, s, h] sends {tp_bytes:.0f}",
                      hint(check, block, "one comm.all_gather in g, one comm.reduce_scatter in g-bar, along "
                           "the sequence (dim 1)", "bytes"))
    return report(name, True, "output rows, input gradient and every weight gradient equal the dense layer "
                  f"(float64, atol {ATOL:g}); the forward sent {ag:.0f} + {rs:.0f} bytes, TP's all-reduce "
                  f"{tp_bytes:.0f}: the same")

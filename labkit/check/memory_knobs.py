"""Check for the Memory-knobs lab: selective recomputation of the attention core, its RNG restored.

``student_fn(core, q, k, v)`` must return what ``core(q, k, v)`` returns (the causal attention of a
tensor-parallel rank's heads, with attention dropout drawing from ``core.attention_dropout.generator``)
while keeping none of its [b, n, s, s] scores for the backward: the backward computes them again.
For the gradients to be exact, the recomputation must draw the SAME dropout mask as the forward:
save the generator's state before the forward, set it before the recomputation, and put back the
state the generator had reached, so that the next draws are those of a run without recomputation
(Megatron's ``CheckpointFunction``, ``megatron/core/tensor_parallel/random.py``).

The check cuts one transformer layer over 2 gloo ranks (TP, float64, attention dropout 0.2, the
model-parallel stream seeded as labkit seeds it), runs it twice from the same generator state,
without and with the student's recomputation, and compares the output, the input gradient and
every weight gradient (exactly: 1e-12), the generator's state after the step, and what the
forward saved (no [b, n, s, s] tensor). labkit's own recomputation raises while it runs.
"""
from __future__ import annotations

from . import describe_mismatch, forbidden, report
from .legacy import hint, run_student

TOL = 1e-12
OWN = ("labkit.recompute:checkpoint", "labkit.recompute:CheckpointFunction.forward",
       "labkit.recompute:CheckpointFunction.backward", "labkit.recompute:checkpoint_module")


def _worker(student_fn, seed: int, p: float):
    import copy

    import torch

    from ..groups import world_group
    from ..measure.activations import saved_activations
    from ..model import GPTConfig, TransformerLayer
    from ..tensor_parallel.plan import apply_plan, layer_plan

    group = world_group()
    cfg = GPTConfig(num_layers=1, hidden_size=16, num_attention_heads=4, seq_length=8, attention_dropout=p)
    gen = torch.Generator().manual_seed(seed)
    dense = TransformerLayer(cfg).double()
    with torch.no_grad():
        for prm in dense.parameters():
            prm.copy_(torch.randn(prm.shape, generator=gen, dtype=torch.float64) * 0.3)
    plain = apply_plan(copy.deepcopy(dense), layer_plan(), group)
    mine = apply_plan(copy.deepcopy(dense), layer_plan(), group)
    core = mine.self_attention.core_attention
    run_core = core.forward
    core.forward = lambda q, k, v: student_fn(_Core(run_core, core.attention_dropout), q, k, v)
    x = torch.randn(2, cfg.seq_length, cfg.hidden_size, generator=gen, dtype=torch.float64)
    dy = torch.randn(2, cfg.seq_length, cfg.hidden_size, generator=gen, dtype=torch.float64)
    out = {}
    for name, layer in (("plain", plain), ("mine", mine)):
        g = torch.Generator().manual_seed(seed + 2718 + group.rank)   # the model-parallel stream
        for m in layer.modules():
            if hasattr(m, "generator"):
                m.generator = g
        xr = x.clone().requires_grad_()
        ctx = forbidden(*OWN, why="recomputation is the exercise") if name == "mine" else _null()
        with ctx:
            saved, y = saved_activations(layer, xr, exclude=list(layer.parameters()))
            y.backward(dy)
        grads = {n: prm.grad.detach().clone() for n, prm in layer.named_parameters()}
        out[name] = {"y": y.detach(), "dx": xr.grad.detach(), "grads": grads, "state": g.get_state(),
                     "shapes": [s for _, s in saved.table()]}
    return out


class _Core:
    """What the student's function receives: call it like the module; its dropout is ``attention_dropout``."""

    def __init__(self, run, dropout):
        self.run, self.attention_dropout = run, dropout

    def __call__(self, q, k, v):
        return self.run(q, k, v)


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def recompute_core(student_fn, world_size: int = 2, seed: int = 0, p: float = 0.2):
    """Run a TP layer with ``student_fn`` recomputing its core attention; print one [check] line."""
    name = f"recompute_core ({world_size} ranks, attention dropout {p})"
    results, failed = run_student(name, _worker, world_size, student_fn, seed, p, student_fn=student_fn)
    if failed is not None:
        return failed
    levels = {
        "grads": ["the output is right, the gradients are not: the recomputation did not reproduce the forward",
                  "the recomputed forward drew a new dropout mask: it must draw the forward's",
                  "in forward: ctx.state = generator.get_state() before running core; in backward: "
                  "now = generator.get_state(); generator.set_state(ctx.state); recompute; "
                  "generator.set_state(now)"],
        "state": ["the gradients are exact, but the generator is not where a run without recomputation "
                  "leaves it: the next microbatch would draw other masks",
                  "after the recomputation, set the generator back to the state it had before it"],
        "saved": ["something of shape [b, n, s, s] was kept for the backward: that is what recomputation "
                  "must not keep", "run core(q, k, v) under torch.no_grad() in the forward and keep only q, k, v"]}
    for r, res in enumerate(results):
        a, b = res["plain"], res["mine"]
        problem = describe_mismatch(b["y"], a["y"], TOL, TOL, what=f"rank {r}, output: ")
        if problem:
            return report(name, False, problem, hint("recompute_core", student_fn,
                                                     ["the forward must return core(q, k, v)"], "out"))
        for what, got, want in [("input gradient", b["dx"], a["dx"])] + [
                (n, b["grads"][n], a["grads"][n]) for n in a["grads"]]:
            problem = describe_mismatch(got, want, TOL, TOL, what=f"rank {r}, {what}: ")
            if problem:
                return report(name, False, problem, hint("recompute_core", student_fn, levels["grads"], "grads"))
        if not bool((a["state"] == b["state"]).all()):
            return report(name, False, f"rank {r}: the generator's state after the step differs",
                          hint("recompute_core", student_fn, levels["state"], "state"))
        scores = [s for s in b["shapes"] if len(s) == 4 and s[-1] == s[-2] and s[-1] > 2]
        if scores:
            return report(name, False, f"rank {r}: the forward kept tensors of shape {scores[0]}",
                          hint("recompute_core", student_fn, levels["saved"], "saved"))
    kept = results[0]["plain"]["shapes"]
    n_scores = sum(1 for s in kept if len(s) == 4 and s[-1] == s[-2] and s[-1] > 2)
    return report(name, True, f"output, input gradient and every weight gradient equal the layer without "
                  f"recomputation (float64, {TOL:g}), the generator ends where it would, and the forward kept "
                  f"no [b, n, s, s] tensor (without recomputation: {n_scores})")

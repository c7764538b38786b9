"""Check for the Memory-knobs lab: selective recomputation of the attention core, its RNG restored.

``recompute(core, q, k, v)`` must return what ``core(q, k, v)`` returns (the causal attention of a
tensor-parallel rank's heads, with attention dropout drawing from ``core.attention_dropout.generator``)
while keeping none of its [b, n, s, s] scores for the backward: the backward computes them again.
For the gradients to be exact, the recomputation must draw the SAME dropout mask as the forward:
save the generator's state before the forward, set it before the recomputation, and put back the
state the generator had reached, so that the next draws are those of a run without recomputation
(Megatron's ``CheckpointFunction``, ``megatron/core/tensor_parallel/random.py``).

One Spec, ``recompute-core`` (:mod:`labkit.check.spec`): ``produce`` cuts one transformer layer
over ``world_size`` gloo ranks (TP, float64, attention dropout ``p``, the model-parallel stream
seeded as labkit seeds it, hidden dropout drawing from it after the core, so a generator not put
back shows) and runs it with the student's recomputation in place of the core's
forward, labkit's own recomputation (``labkit.recompute``) switched off; it returns each rank's
output, input gradient, weight gradients, generator state after the step, and the shapes of what
the forward kept (saved for backward, or held anywhere a Python object can reach). ``judge`` runs
the same layer *without* recomputation from the same random state, in its own ranks, and compares
exactly (1e-12). Visible: 2 ranks, dropout 0.2; hidden: other world sizes, seeds, dropout rates and
sequence lengths (``solutions/hidden/memory-knobs-lab.json``).
"""
from __future__ import annotations

import functools

from . import describe_mismatch, report
from .hints import asker
from .spec import Spec, failed, ranks, run

TOL = 1e-12
OWN = ("labkit.recompute:checkpoint", "labkit.recompute:CheckpointFunction.forward",
       "labkit.recompute:CheckpointFunction.backward", "labkit.recompute:checkpoint_module")
WHY = "recomputation is the exercise"
BATCH, HIDDEN, HEADS = 2, 16, 4


class _Core:
    """What the student's function receives: call it like the module; its dropout is ``attention_dropout``."""

    def __init__(self, run, dropout):
        self.run, self.attention_dropout = run, dropout

    def __call__(self, q, k, v):
        return self.run(q, k, v)


def _scores(shapes, seq_length: int) -> list:
    """The [b, n, s, s] shapes among ``shapes`` (the attention scores, probabilities, dropout mask)."""
    return [list(s) for s in shapes if len(s) == 4 and s[0] == BATCH and s[-1] == s[-2] == seq_length]


def _held(seq_length: int) -> list:
    """Shapes of the [b, n, s, s] tensors any Python object holds now (e.g. one kept on ``ctx``)."""
    import gc

    import torch
    gc.collect()
    return [list(t.shape) for t in gc.get_objects()
            if isinstance(t, torch.Tensor) and _scores([tuple(t.shape)], seq_length)]


def _layer_run(fn, seed: int, p: float, seq_length: int, banning=None) -> dict:
    """One TP layer's forward and backward on this rank; ``fn`` replaces its core's forward (None: as is)."""
    import contextlib
    import copy

    import torch

    from ..groups import world_group
    from ..measure.activations import saved_activations
    from ..model import GPTConfig, TransformerLayer
    from ..tensor_parallel.plan import apply_plan, tp_plan

    group = world_group()
    cfg = GPTConfig(num_layers=1, hidden_size=HIDDEN, num_attention_heads=HEADS, seq_length=seq_length,
                    attention_dropout=p, hidden_dropout=0.1)    # later draws from the same stream
    gen = torch.Generator().manual_seed(seed)
    dense = TransformerLayer(cfg).double()
    with torch.no_grad():
        for prm in dense.parameters():
            prm.copy_(torch.randn(prm.shape, generator=gen, dtype=torch.float64) * 0.3)
    layer = apply_plan(copy.deepcopy(dense), tp_plan(), group)
    if fn is not None:
        core = layer.self_attention.core_attention
        run_core = core.forward
        core.forward = lambda q, k, v: fn(_Core(run_core, core.attention_dropout), q, k, v)
    x = torch.randn(BATCH, seq_length, HIDDEN, generator=gen, dtype=torch.float64)
    dy = torch.randn(BATCH, seq_length, HIDDEN, generator=gen, dtype=torch.float64)
    g = torch.Generator().manual_seed(seed + 2718 + group.rank)          # the model-parallel stream
    for m in layer.modules():
        if hasattr(m, "generator"):
            m.generator = g
    xr = x.clone().requires_grad_()
    with banning if banning is not None else contextlib.nullcontext():
        saved, y = saved_activations(layer, xr, exclude=list(layer.parameters()))
        held = _held(seq_length) if fn is not None else []
        y.backward(dy)
    return {"y": y.detach(), "dx": xr.grad.detach(), "state": g.get_state(),
            "grads": {n: prm.grad.detach().clone() for n, prm in layer.named_parameters()},
            "saved": [list(s) for _, s in saved.table()], "held": held}


def _worker(student, seed: int, p: float, seq_length: int):
    fn = student.load()["recompute"]
    return _layer_run(fn, seed, p, seq_length, student.banning(OWN, WHY))


def _produce(student, world_size=2, seed=0, p=0.2, seq_length=8):
    results, failure = ranks(_worker, world_size, student, seed, p, seq_length)
    return failure or results


def _plain_worker(seed: int, p: float, seq_length: int):
    return _layer_run(None, seed, p, seq_length)


@functools.lru_cache(maxsize=8)
def reference(world_size: int, seed: int, p: float, seq_length: int) -> tuple:
    """Each rank's run of the layer without recomputation (the judge's own ranks, no student code)."""
    from ..launcher import launch
    return tuple(launch(_plain_worker, world_size, seed, p, seq_length, backend="gloo", timeout=120))


def _judge(data, world_size=2, seed=0, p=0.2, seq_length=8):
    import torch
    name = f"recompute_core ({world_size} rank{'s' * (world_size > 1)}, attention dropout {p})"
    bad = failed(name, data)
    if bad is not None:
        return bad
    if not isinstance(data, list) or len(data) != world_size:
        return report(name, False, f"expected one result per rank ({world_size}), got {type(data).__name__}")
    plain = reference(world_size, seed, p, seq_length)
    for r, (a, b) in enumerate(zip(plain, data)):
        problem = describe_mismatch(b["y"], a["y"], TOL, TOL, what=f"rank {r}, output: ")
        if problem:
            return report(name, False, problem, "the forward must return core(q, k, v), the same tensor the "
                          "core returns without recomputation")
        for what, want in [("input gradient", a["dx"])] + sorted(a["grads"].items()):
            got = b["dx"] if what == "input gradient" else b["grads"].get(what)
            problem = describe_mismatch(got, want, TOL, TOL, what=f"rank {r}, {what}: ")
            if problem:
                return report(name, False, problem, "the output is right, the gradients are not: the "
                              "recomputation did not reproduce the forward. With dropout on, it drew a new "
                              "mask: it must draw the forward's (check.hint('recompute-core') for more)")
        if not torch.equal(torch.as_tensor(b["state"]), torch.as_tensor(a["state"])):
            return report(name, False, f"rank {r}: the generator's state after the step differs from a run "
                          "without recomputation", "the gradients are exact, but the generator is not where "
                          "a run without recomputation leaves it: the next microbatch would draw other masks")
        kept = _scores(b["saved"], seq_length) or _scores(b["held"], seq_length)
        if kept:
            where = "saved for the backward" if _scores(b["saved"], seq_length) else "held (on ctx or elsewhere)"
            return report(name, False, f"rank {r}: the forward kept a tensor of shape {kept[0]} ({where})",
                          "a [b, n, s, s] tensor kept until the backward is what recomputation must not keep: "
                          "run core(q, k, v) under torch.no_grad() in the forward and keep only q, k, v")
    n_scores = len(_scores(plain[0]["saved"], seq_length))
    return report(name, True, f"output, input gradient and every weight gradient equal the layer without "
                  f"recomputation (float64, {TOL:g}), the generator ends where it would, and the forward kept "
                  f"no [b, n, s, s] tensor (without recomputation: {n_scores})")


RECOMPUTE_CORE = Spec(
    "recompute-core", {"recompute": "recompute"}, _produce, _judge, cases=({"world_size": 2, "p": 0.2},),
    forbid=OWN, ranks=True, why=WHY, hints=(
        "forward: gen = core.attention_dropout.generator; keep gen.get_state() (and core, gen) on ctx; run "
        "core(q, k, v) under torch.no_grad(); ctx.save_for_backward(q, k, v): nothing else",
        "backward: q, k, v = (t.detach().requires_grad_() for t in ctx.saved_tensors); now = gen.get_state(); "
        "gen.set_state(ctx.state); out = core(q, k, v) under torch.enable_grad(); gen.set_state(now)",
        "then torch.autograd.backward(out, grad) and return None, q.grad, k.grad, v.grad (None for core: "
        "backward returns one gradient per input of forward)"))
SPECS = {"recompute-core": RECOMPUTE_CORE}
hint = asker(SPECS)


def recompute_core(student_fn, world_size: int = 2, seed: int = 0, p: float = 0.2, seq_length: int = 8):
    """Run a TP layer with ``student_fn`` recomputing its core attention; print one [check] line."""
    return run(RECOMPUTE_CORE, {"recompute": student_fn}, world_size=world_size, seed=seed, p=p,
               seq_length=seq_length)

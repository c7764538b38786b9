"""Activation recomputation (Chen et al. 2016; Korthikanti et al. 2022, Sec. 5), as Megatron-LM turns it.

Chapter "Memory knobs". A recomputed region keeps only its inputs for the backward; the backward
runs its forward again (with autograd on) and then its backward. The region must draw the SAME
dropout masks the second time, so every random state it reads is saved before the first forward
and restored around the second, then put back (Megatron's ``CheckpointFunction`` in
``megatron/core/tensor_parallel/random.py``, d98e8a64: the CPU and CUDA generators and the
model-parallel RNG tracker). labkit's dropouts draw from explicit generators
(``tensor_parallel/random.py``: the default and the model-parallel stream), so "every RNG" is:
those generators of the region's Dropouts, and torch's CPU generator. ``torch.utils.checkpoint``
restores only torch's global generators, not these: with dropout on it gives wrong gradients.

Megatron's arguments (``TrainConfig``), applied to each model chunk by :func:`apply`:

    recompute_granularity "full"       whole transformer layers; recompute_method "uniform": units of
                                       recompute_num_layers layers; "block": the first
                                       recompute_num_layers layers of the chunk, one by one
    recompute_granularity "selective"  the submodules in recompute_modules (default core_attn, the
                                       attention scores and softmax: the 5as/h term of Korthikanti's
                                       Table 2), found by role (``labkit.roles``: each role
                                       names the recompute module that recomputes it); also
                                       "mlp" and "layernorm"
"""
from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar

import torch
from torch import nn

from . import roles
from .modules import Dropout


# Which forward of a recomputed region is running: "first" (activations dropped), "again" (in the
# backward), or None. labkit.fp8 reads it: delayed scaling must reuse the first forward's scales.
PHASE: ContextVar[str | None] = ContextVar("labkit_recompute_phase", default=None)


# What the backward running now asks for. A zero-bubble schedule (ZB-H1) splits a backward in two:
# B computes the input gradient only (``torch.autograd.backward(..., inputs=[x])``), W the weight
# gradients. A recomputed region runs its own inner backward, which would otherwise add its weights'
# gradients in B and again in W (twice the true gradient); under "inputs" it computes only the
# gradients of its inputs, so its weights get theirs once, in W. A module global, not a ContextVar:
# on CUDA the autograd engine calls the backward from its own device thread.
GRADS_FOR = {"now": None}       # None: every gradient; "inputs": the region's inputs' only


@contextmanager
def grads_for(what: str | None):
    """Within the block, recomputed regions' backwards compute ``what`` ("inputs" or None: all)."""
    before, GRADS_FOR["now"] = GRADS_FOR["now"], what
    try:
        yield
    finally:
        GRADS_FOR["now"] = before


@contextmanager
def _phase(name: str):
    token = PHASE.set(name)
    try:
        yield
    finally:
        PHASE.reset(token)


def region_generators(modules) -> list[torch.Generator]:
    """The distinct generators of every Dropout in ``modules`` (what a recompute must restore)."""
    gens: dict[int, torch.Generator] = {}
    for m in modules:
        for d in m.modules():
            if isinstance(d, Dropout) and d.generator is not None:
                gens.setdefault(id(d.generator), d.generator)
    return list(gens.values())


class CheckpointFunction(torch.autograd.Function):
    """forward: run ``fn(*args)`` without keeping its activations, saving the random states;
    backward: restore them, run ``fn`` again with autograd, backpropagate, put the states back."""

    @staticmethod
    def forward(ctx, fn, generators, restore, *args):
        ctx.fn, ctx.generators, ctx.restore = fn, generators, restore
        ctx.states = [g.get_state() for g in generators] + [torch.get_rng_state()]
        ctx.tensor_mask = [torch.is_tensor(a) for a in args]
        ctx.save_for_backward(*[a for a in args if torch.is_tensor(a)])
        ctx.others = [a for a in args if not torch.is_tensor(a)]
        with torch.no_grad(), _phase("first"):
            return fn(*args)

    @staticmethod
    def backward(ctx, *grads):
        others, saved, args = iter(ctx.others), iter(ctx.saved_tensors), []
        for is_tensor in ctx.tensor_mask:
            if is_tensor:
                t = next(saved)
                args.append(t.detach().requires_grad_(t.requires_grad))
            else:
                args.append(next(others))
        now = [g.get_state() for g in ctx.generators] + [torch.get_rng_state()]
        if ctx.restore:                                      # the masks of the first forward
            _set(ctx.generators, ctx.states)
        with torch.enable_grad(), _phase("again"):
            out = ctx.fn(*args)
        _set(ctx.generators, now)                            # as if nothing had been drawn again
        outs = out if isinstance(out, tuple) else (out,)
        pairs = [(o, g) for o, g in zip(outs, grads) if torch.is_tensor(o) and o.requires_grad]
        if GRADS_FOR["now"] == "inputs":    # B of a zero-bubble schedule: the weights wait for W
            wanted = [a for a in args if torch.is_tensor(a) and a.requires_grad]
            if wanted and pairs:
                torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs], inputs=wanted)
        else:
            torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])
        return (None, None, None, *[a.grad if torch.is_tensor(a) and a.requires_grad else None for a in args])


def _set(generators, states) -> None:
    for g, s in zip(generators, states[:-1]):
        g.set_state(s)
    torch.set_rng_state(states[-1])


def checkpoint(fn, generators, *args, restore_rng: bool = True):
    """``fn(*args)``, recomputed in the backward. ``restore_rng=False`` is the trap (for tests and
    the lab): the recomputation draws new masks, so the gradients are those of another network."""
    return CheckpointFunction.apply(fn, generators, restore_rng, *args)


def checkpoint_module(module: nn.Module, restore_rng: bool = True) -> nn.Module:
    """Recompute ``module`` in the backward from now on (its forward is wrapped, its name kept)."""
    forward, gens = module.forward, region_generators([module])
    module.forward = lambda *args: checkpoint(forward, gens, *args, restore_rng=restore_rng)
    module.recomputed = True
    return module


class RecomputedLayers:
    """The decoder's layer runner (``GPT.layer_runner``, a seam of the one forward) that
    recomputes whole layers, Megatron's ``TransformerBlock._checkpointed_forward``."""

    def __init__(self, method: str, num_layers: int, restore_rng: bool = True):
        self.method, self.num_layers, self.restore_rng = method, num_layers, restore_rng

    def __call__(self, layers: list, x, position_ids=None):
        k = self.num_layers                                       # uniform: units of k layers;
        units = ([layers[i:i + k] for i in range(0, len(layers), k)] if self.method == "uniform"
                 else [[layer] for layer in layers])              # block: layer by layer
        for j, unit in enumerate(units):
            def run(h, pos, unit=unit):
                for layer in unit:
                    h = layer(h, pos)
                return h
            if self.method == "block" and j >= k:                 # past the first k: kept as usual
                x = run(x, position_ids)
            else:
                x = checkpoint(run, region_generators(unit), x, position_ids, restore_rng=self.restore_rng)
        return x


def apply(chunks: list, cfg, restore_rng: bool = True) -> None:
    """Turn on the recomputation ``cfg`` asks for, on every model chunk (after the TP/CP/EP plans,
    so it recomputes the parallel modules: their collectives run again in the backward)."""
    if cfg.recompute_granularity == "full":
        for chunk in chunks:
            chunk.layer_runner = RecomputedLayers(cfg.recompute_method, cfg.recompute_num_layers, restore_rng)
    elif cfg.recompute_granularity == "selective":
        wanted = roles.by_recompute(cfg.recompute_modules or ("core_attn",))   # Megatron's names -> roles
        for chunk in chunks:
            for name, m in list(chunk.named_modules()):
                if name.startswith("decoder.layers.") and getattr(m, "role", None) in wanted:
                    checkpoint_module(m, restore_rng)

"""Planted bugs for teaching the first-divergence tool, each selectable by name: ``inject="..."``.

Chapter "When training goes wrong". Each bug is a small change applied on every rank after the
model is cut (``Bug.apply(engine, topo, groups, cfg)``), on the layout it needs (``Bug.layout``);
nothing in labkit's own code changes. ``Bug.expect`` is where ``labkit.debug.first_divergence``
must find it (tests/test_debug_bugs.py proves it does, for each):

    same_seed_tp                  every TP rank initializes its shard from the same seed (the
                                  SmolLM3 restart, Hugging Face's Smol Training Playbook, 2025)
    swapped_collectives           DP rank 1 all-reduces two same-shape gradients in swapped order
                                  (gloo returns at once with wrong values: silent, no hang)
    sp_norm_grads_not_summed      sequence parallelism: the norms' partial gradients not summed over TP
    dp_grads_summed               data parallelism: gradients summed over DP, not averaged
    cp_wrong_causal_offset        context parallelism: CP rank 1 masks as if it held other chunks
    pp_dropped_microbatch_grad    the last stage sends a zero gradient back for microbatch 1
    tied_embedding_grad_not_summed  the first and last stages' copies of the tied embedding are
                                  not summed over the embedding group

and the composition bugs of ``composition.py`` (each invisible on every single axis; the fuzzer,
``labkit.fuzz``, finds them). A lab gets one of the single-axis ones (``LAB_BUGS``) from a seed without its name (:func:`assignment`): the student finds the
layer and the collective with the tool.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, replace

import torch

from .. import comm
from .composition import composition_bugs

MODEL = dict(num_layers=2, hidden_size=32, num_attention_heads=4, seq_length=16, params_dtype="float64",
             micro_batch_size=2, global_batch_size=8, make_vocab_size_divisible_by=64)


@dataclass(frozen=True)
class Bug:
    name: str
    doc: str
    world_size: int
    layout: dict
    apply: object            # (engine, topo, groups, cfg) -> None, on every rank
    expect: dict             # phase, layer, tensor (a part of it), collective ("op on group" or None)

    def kwargs(self) -> dict:
        """``first_divergence(**bug.kwargs())``: the world size and layout it runs on."""
        return {"world_size": self.world_size, **MODEL, **self.layout}


def _params(engine):
    for chunk in engine.runner.chunks:
        yield from chunk.named_parameters()


def _same_seed_tp(engine, topo, groups, cfg):
    """Every TP rank holds TP rank 0's slice: what drawing each shard from one seed gives."""
    with torch.no_grad():
        for name, p in _params(engine):
            if engine.plan[name].cut == "tp":
                p.copy_(comm.broadcast(groups["tp"], p.detach(), src=0))


def _swapped_collectives(engine, topo, groups, cfg):
    if engine.coords["dp"] != 1:
        return
    for m in engine.dp.members:               # plain DP: one all-reduce per gradient, in this order
        if "decoder.layers.1.input_layernorm.weight" in m.names:
            i = m.names.index("decoder.layers.1.input_layernorm.weight")
            j = m.names.index("decoder.layers.1.input_layernorm.bias")
            m.names[i], m.names[j] = m.names[j], m.names[i]
            m.params[i], m.params[j] = m.params[j], m.params[i]


def _drop_sum(axis: str, which):
    def apply(engine, topo, groups, cfg):
        for name, e in list(engine.plan.items()):
            if which(name, e):
                blocks = tuple(replace(b, sums=tuple(a for a in b.sums if a != axis)) for b in e.blocks)
                engine.plan[name] = replace(e, blocks=blocks)
    return apply


def _dp_grads_summed(engine, topo, groups, cfg):
    for m in engine.dp.members:
        def finish(m=m):
            for p in m.params:
                if p.grad is not None:
                    p.grad.copy_(comm.all_reduce(m.group, p.grad, op="sum"))   # the bug: "mean" forgotten
            m.memory = m.held_bytes()
        m.finish_grad_sync = finish


def _cp_wrong_causal_offset(engine, topo, groups, cfg):
    if engine.coords["cp"] != 1:
        return
    for chunk in engine.runner.chunks:
        for module in chunk.modules():
            if type(module).__name__ == "ContextParallelAttention":
                module.layout = "contiguous"      # masks as if it held chunks (2, 3), not (1, 2)


def _pp_dropped_microbatch_grad(engine, topo, groups, cfg):
    if engine.coords["pp"] != topo.pp - 1:
        return
    m, seen = cfg.num_microbatches(topo), [0]

    def drop(module, args):
        n, seen[0] = seen[0] % m, seen[0] + 1
        if n == 1 and args[0].requires_grad:   # microbatch 1's input: its gradient goes back as zeros
            args[0].register_hook(torch.zeros_like)
    engine.runner.chunks[0].register_forward_pre_hook(drop)


BUGS = {b.name: b for b in [
    Bug("same_seed_tp", "every TP rank initializes its shard from the same seed (the SmolLM3 bug)", 2,
        dict(tensor_model_parallel_size=2), _same_seed_tp,
        dict(phase="weights", iteration=0, layer="embedding", tensor="word_embeddings.weight", collective=None)),
    Bug("swapped_collectives", "DP rank 1 all-reduces two same-shape gradients in swapped order", 2, {},
        _swapped_collectives, dict(phase="grads", layer="decoder.layers.1", tensor="input_layernorm.weight",
                                   collective="all_reduce on dp")),
    Bug("sp_norm_grads_not_summed", "sequence parallelism: the norms' gradients are not summed over TP", 2,
        dict(tensor_model_parallel_size=2, sequence_parallel=True),
        _drop_sum("tp", lambda n, e: "layernorm" in n),
        dict(phase="grads", layer="decoder.layers.0", tensor="input_layernorm.weight", collective="all_reduce on tp")),
    Bug("dp_grads_summed", "data parallelism: gradients summed over DP instead of averaged", 2, {},
        _dp_grads_summed, dict(phase="grads", layer="embedding", tensor="word_embeddings.weight",
                               collective="all_reduce on dp")),
    Bug("cp_wrong_causal_offset", "context parallelism: CP rank 1 computes its causal mask with a wrong offset",
        2, dict(context_parallel_size=2), _cp_wrong_causal_offset,
        dict(phase="forward", microbatch=0, layer="decoder.layers.0", tensor="self_attention",
             collective="batch_isend_irecv on cp")),
    Bug("pp_dropped_microbatch_grad", "the last pipeline stage sends back a zero gradient for microbatch 1", 2,
        dict(pipeline_model_parallel_size=2), _pp_dropped_microbatch_grad,
        dict(phase="backward", microbatch=1, layer="decoder.layers.0", tensor="output.grad",
             collective="batch_isend_irecv on pp")),
    Bug("tied_embedding_grad_not_summed", "the tied embedding's two copies are not summed over the embedding group",
        2, dict(pipeline_model_parallel_size=2), _drop_sum("embd", lambda n, e: "embd" in e.sum_axes()),
        dict(phase="grads", layer="embedding", tensor="word_embeddings.weight", collective="all_reduce on embd")),
]}
LAB_BUGS = tuple(sorted(BUGS))          # the single-axis bugs: what a lab assigns
BUGS.update({b.name: b for b in composition_bugs(Bug)})


def _token(name: str, seed: int) -> str:
    return f"assigned-{seed}"


def assignment(seed: int) -> dict:
    """A bug for a student, chosen from ``seed`` and not named: ``first_divergence(**assignment(s))``."""
    bug = assigned_bug(seed)
    return {**bug.kwargs(), "inject": _token(bug.name, seed)}


def assigned_bug(seed: int) -> Bug:
    """The bug :func:`assignment` gives ``seed`` (for the lab's check, and instructors)."""
    return BUGS[LAB_BUGS[random.Random(seed).randrange(len(LAB_BUGS))]]


def resolve(inject: str | None) -> str | None:
    """A bug name from a name or an assignment's token; ValueError naming the choices."""
    if inject is None or inject in BUGS:
        return inject
    if isinstance(inject, str) and inject.startswith("assigned-") and inject[9:].lstrip("-").isdigit():
        return assigned_bug(int(inject[9:])).name
    raise ValueError(f"inject must be one of {sorted(BUGS)} (labkit.debug.BUGS), got {inject!r}")


class Plant:
    """``labkit.train(probe=Plant(name))``: apply planted bug ``name`` on every rank, record nothing
    (the fuzzer's way to run a layout with a bug; ``fingerprints.Recording`` also records)."""

    def __init__(self, bug: str):
        self.bug = resolve(bug)

    def __call__(self, engine, topo, groups, cfg):
        BUGS[self.bug].apply(engine, topo, groups, cfg)
        return _Quiet()


class _Quiet:
    def begin(self, iteration: int) -> None:
        pass

    def end(self):
        return None

"""Planted bugs that only a COMPOSITION of parallelisms shows: each is a no-op on every single axis.

Chapter "Finding the bug nobody chose" (book/fuzzing.ipynb). Modelled on the classes of silent
numerical bugs a fuzz of Megatron-Core's compositions found (NVIDIA/Megatron-LM#7452): each
condition below names two (or three) things that must hold together; on any layout where one is
missing the bug changes nothing, so a test suite that checks one axis at a time passes. They are
applied like ``bugs.py``'s (``Bug.apply(engine, topo, groups, cfg)`` on every rank after the model
is cut; nothing in labkit's own code changes) and are part of ``labkit.debug.BUGS``:

    vocab_loss_gathered_logits     TP > 1 AND untied output layer: the output layer's logits are
                                   gathered, then fed to the vocabulary-parallel loss, whose
                                   denominator then counts every class t times: loss + log t, and
                                   the logits' gradient divided by t (#7452's "loss + log 2")
    sp_norm_grads_not_summed_with_cp  SP AND CP > 1: the norms' gradients are reduced over CP (the
                                   dp x cp average) but their TP sum is skipped
    vpp_embedding_grad_not_summed  PP with VPP (v > 1) AND tied embeddings: the embedding group's
                                   all-reduce is skipped (plain 1F1B sums it)
    cp_grad_scale_one_over_dp      DP > 1 AND CP > 1: gradients averaged with 1/dp, not 1/(dp x cp)
                                   (each alone: 1/dp or 1/cp is right)
    etp_expert_grads_wrong_group   MoE AND expert_tensor_parallel_size != tensor_model_parallel_size:
                                   expert gradients averaged over the expert-DP group without their
                                   edp / (dp x cp) scale (equal when etp = tp and ep = 1)
    dist_opt_shard_off_padded_vocab  the distributed optimizer (ZeRO >= 1) with DP > 1 AND a padded
                                   vocabulary (Megatron pads 256 to a multiple of divisible_by x tp):
                                   each shard after the first starts one element late, so the
                                   element at its boundary keeps a zero gradient
"""
from __future__ import annotations

import math
from dataclasses import replace

from ..config import BYTE_VOCAB_SIZE


def _chunks(engine):
    return engine.runner.chunks


def _padded(cfg) -> bool:
    return cfg.model_config().vocab_size != BYTE_VOCAB_SIZE


# when each bug acts (cfg: the TrainConfig, topo: its Topology); everywhere else it is a no-op
WHEN = {
    "vocab_loss_gathered_logits": lambda cfg, topo: topo.tp > 1 and cfg.untie_embeddings_and_output_weights,
    "sp_norm_grads_not_summed_with_cp": lambda cfg, topo: cfg.sequence_parallel and topo.tp > 1 and topo.cp > 1,
    # the tied weight's two copies are summed only where the ends sit on two ranks (not under a V)
    "vpp_embedding_grad_not_summed": lambda cfg, topo: (cfg.virtual_pipeline_size() > 1
                                                        and not cfg.untie_embeddings_and_output_weights
                                                        and len(cfg.embedding_ranks()) > 1),
    "cp_grad_scale_one_over_dp": lambda cfg, topo: topo.dp > 1 and topo.cp > 1,
    "etp_expert_grads_wrong_group": lambda cfg, topo: cfg.num_experts is not None and topo.etp != topo.tp,
    "dist_opt_shard_off_padded_vocab": lambda cfg, topo: (cfg.effective_zero_stage >= 1 and topo.dp * topo.cp > 1
                                                          and _padded(cfg)),
}


def _vocab_loss_gathered_logits(engine, topo, groups, cfg):
    t = topo.tp
    if not WHEN["vocab_loss_gathered_logits"](cfg, topo):
        return
    for chunk in _chunks(engine):
        if getattr(chunk, "loss_fn", None) is None:
            continue

        def pre(module, args, t=t):                      # logits [b, s, V/t]: gradient / t
            if args[0].requires_grad:
                args[0].register_hook(lambda g: g / t)

        chunk.loss_fn.register_forward_pre_hook(pre)
        chunk.loss_fn.register_forward_hook(lambda module, args, out, t=t: out + math.log(t))


def _drop_sums(engine, axis: str, which) -> None:
    for name, e in list(engine.plan.items()):
        if which(name, e):
            blocks = tuple(replace(b, sums=tuple(a for a in b.sums if a != axis)) for b in e.blocks)
            engine.plan[name] = replace(e, blocks=blocks)


def _sp_norm_grads_not_summed_with_cp(engine, topo, groups, cfg):
    if WHEN["sp_norm_grads_not_summed_with_cp"](cfg, topo):
        _drop_sums(engine, "tp", lambda n, e: "layernorm" in n or n.endswith("norm.weight"))


def _vpp_embedding_grad_not_summed(engine, topo, groups, cfg):
    if WHEN["vpp_embedding_grad_not_summed"](cfg, topo):
        _drop_sums(engine, "embd", lambda n, e: "embd" in e.sum_axes())


def _after_grad_sync(engine, then) -> None:
    """Run ``then()`` right after the data-parallel gradient sync (before the TP/embd sums)."""
    finish = engine.dp.finish_grad_sync

    def patched():
        finish()
        then()
    engine.dp.finish_grad_sync = patched


def _cp_grad_scale_one_over_dp(engine, topo, groups, cfg):
    if WHEN["cp_grad_scale_one_over_dp"](cfg, topo):    # averaged with 1/dp: cp times too large
        _after_grad_sync(engine, lambda: engine.dp.scale_grads(topo.cp))


def _etp_expert_grads_wrong_group(engine, topo, groups, cfg):
    if not WHEN["etp_expert_grads_wrong_group"](cfg, topo):
        return
    factor = groups["dp"].size * groups["cp"].size / groups["edp"].size   # undoes edp / (dp x cp)

    def rescale():
        for m in engine.dp.members:
            if m.group is groups["edp"] and any(engine.plan[n].expert for n in m.names):
                m.scale_grads(factor)
    if factor != 1:
        _after_grad_sync(engine, rescale)


def _dist_opt_shard_off_padded_vocab(engine, topo, groups, cfg):
    if not WHEN["dist_opt_shard_off_padded_vocab"](cfg, topo):   # unpadded: the boundaries are right
        return

    def shift():                # every holder of a shard: a member, or each unit of ZeRO-2/3 by units
        for h in (h for m in engine.dp.members for h in getattr(m, "units", [m])):
            if getattr(h, "lo", 0) <= 0:
                continue
            if getattr(h, "shard", None) is not None and h.shard.grad is not None:
                h.shard.grad[0] = 0.0                    # the boundary element: in nobody's shard
            elif getattr(h, "main_grad", None) is not None:
                h.main_grad[h.lo] = 0.0                  # mixed precision: main_grad, before the masters read it
    _after_grad_sync(engine, shift)


def composition_bugs(Bug) -> list:
    """The composition bugs as ``bugs.Bug`` records (passed in: bugs.py imports this module).
    ``layout`` is the smallest composition that shows each; ``expect`` where ``first_divergence``
    finds it (tests/test_fuzz_bugs.py)."""
    return [
        Bug("vocab_loss_gathered_logits", "TP x untied output: gathered logits fed to the vocab-parallel loss "
            "(loss + log t, logit gradients / t)", 2,
            dict(tensor_model_parallel_size=2, untie_embeddings_and_output_weights=True),
            _vocab_loss_gathered_logits,
            dict(phase="backward", layer="decoder.final_layernorm", tensor="output.grad",
                 collective="all_reduce on tp")),
        Bug("sp_norm_grads_not_summed_with_cp", "SP x CP: the norms' gradients reduced over CP but not summed "
            "over TP", 4, dict(tensor_model_parallel_size=2, sequence_parallel=True, context_parallel_size=2),
            _sp_norm_grads_not_summed_with_cp,
            dict(phase="grads", layer="decoder.layers.0", tensor="input_layernorm.weight", collective="all_reduce on tp")),
        Bug("vpp_embedding_grad_not_summed", "VPP x tied embeddings: the embedding group's all-reduce skipped",
            2, dict(pipeline_model_parallel_size=2, num_layers=4, num_layers_per_virtual_pipeline_stage=1),
            _vpp_embedding_grad_not_summed,
            dict(phase="grads", layer="embedding", tensor="word_embeddings.weight", collective="all_reduce on embd")),
        Bug("cp_grad_scale_one_over_dp", "DP x CP: gradients averaged with 1/dp instead of 1/(dp x cp)", 4,
            dict(context_parallel_size=2), _cp_grad_scale_one_over_dp,
            dict(phase="grads", layer="embedding", tensor="word_embeddings.weight", collective="all_reduce on edp")),
        Bug("etp_expert_grads_wrong_group", "MoE x ETP != TP: expert gradients averaged without their "
            "edp/(dp x cp) scale", 2,
            dict(tensor_model_parallel_size=2, sequence_parallel=True, num_experts=2,
                 expert_tensor_parallel_size=1, moe_router_topk=1),
            _etp_expert_grads_wrong_group,
            dict(phase="grads", layer="decoder.layers.0", tensor="experts", collective=None)),
        Bug("dist_opt_shard_off_padded_vocab", "distributed optimizer x padded vocabulary: shard boundaries "
            "one element off", 2, dict(use_distributed_optimizer=True, make_vocab_size_divisible_by=96),
            _dist_opt_shard_off_padded_vocab,
            dict(phase="grads", layer="decoder.layers.0", tensor="linear_fc1.weight", collective=None)),
    ]


NAMES = ("vocab_loss_gathered_logits", "sp_norm_grads_not_summed_with_cp", "vpp_embedding_grad_not_summed",
         "cp_grad_scale_one_over_dp", "etp_expert_grads_wrong_group", "dist_opt_shard_off_padded_vocab")

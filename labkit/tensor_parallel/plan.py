"""The tensor-parallel plan: which dense module becomes which parallel one, as data.

Chapters "Tensor parallelism" and "Sequence parallelism". Like torchtitan's ``parallelize_llama``
(a dict from module name to style) and picotron's ``apply_tensor_parallel``: the dense model
(labkit/model.py) is not rewritten, its seams are swapped by name. The book prints the plans with
and without sequence parallelism side by side (:func:`describe`).

    apply_tensor_parallel(model, groups["tp"], sequence_parallel=True)   # in place, any PP stage
"""
from __future__ import annotations

from dataclasses import dataclass
from fnmatch import fnmatch
from typing import Callable

from torch import nn

from ..groups import Group
from .layers import ColumnParallelLinear, RowParallelLinear, divide
from .sequence_parallel import ScatterToSequence, mark_sequence_parallel
from .vocab_parallel import VocabParallelCrossEntropyLoss, VocabParallelEmbedding


@dataclass(frozen=True)
class Style:
    """What happens to the modules a pattern names: a sentence for the book, and the builder."""

    what: str
    build: Callable  # (dense module, group) -> module that replaces it (or the same one, tagged)


def _tagged_norm(m, g):
    mark_sequence_parallel(m)
    return m


def tp_plan(sequence_parallel: bool = False, shared_experts: bool = False) -> dict[str, Style]:
    """{module name pattern: Style}, applied in this order by :func:`apply_tensor_parallel`.

    ``shared_experts``: the model's MoE layers have a shared expert (Megatron's SharedExpertMLP),
    cut over tp like the dense MLP; the routed experts are the expert-parallel plan's.
    """
    sp = sequence_parallel
    col = Style("g (all-gather seq) -> column" if sp else "f -> column",
                lambda m, g: ColumnParallelLinear.from_dense(m, g, sequence_parallel=sp))
    row = Style("row -> g-bar (reduce-scatter seq)" if sp else "row -> f-bar (all-reduce)",
                lambda m, g: RowParallelLinear.from_dense(m, g, sequence_parallel=sp))
    norm = (Style("shard [b, s/t, h], grads summed", _tagged_norm) if sp
            else Style("replicated [b, s, h]", lambda m, g: m))
    plan = {
        "embedding.word_embeddings": Style("vocab rows V/t -> f-bar (all-reduce)",
                                           lambda m, g: VocabParallelEmbedding.from_dense(m, g)),
        "embedding.to_sequence_shard": (Style("+ positions, keep my s/t", lambda m, g:
                                              ScatterToSequence(g)) if sp else
                                        Style("+ positions, replicated", lambda m, g: m)),
        "decoder.layers.*.input_layernorm": norm,
        "decoder.layers.*.self_attention.linear_qkv": Style(col.what + ", heads a/t", col.build),
        "decoder.layers.*.self_attention.linear_proj": row,
        "decoder.layers.*.pre_mlp_layernorm": norm,
        "decoder.layers.*.mlp.linear_fc1": Style(col.what + ", 4h/t", col.build),
        "decoder.layers.*.mlp.linear_fc2": row,
        **({"decoder.layers.*.mlp.shared_experts.linear_fc1": Style(col.what + ", shared ffn/t", col.build),
            "decoder.layers.*.mlp.shared_experts.linear_fc2": row} if shared_experts else {}),
        "decoder.final_layernorm": norm,
        "output_layer": Style(("g (all-gather seq)" if sp else "f") + " -> vocab rows V/t", col.build),
        "loss_fn": Style("vocab-parallel cross-entropy", lambda m, g: VocabParallelCrossEntropyLoss(g)),
    }
    return plan


def layer_plan(sequence_parallel: bool = False) -> dict[str, Style]:
    """The part of :func:`tp_plan` that cuts one ``TransformerLayer`` (names relative to the layer)."""
    prefix = "decoder.layers.*."
    return {k[len(prefix):]: v for k, v in tp_plan(sequence_parallel).items() if k.startswith(prefix)}


def describe(plan: dict[str, Style]) -> dict[str, str]:
    """{pattern: what happens}: the plan as the book prints it."""
    return {name: style.what for name, style in plan.items()}


def apply_plan(model: nn.Module, plan: dict[str, Style], group: Group) -> nn.Module:
    """Replace every module whose name matches a pattern (in plan order); returns ``model``."""
    for pattern, style in plan.items():
        for name, module in list(model.named_modules()):
            if name and module is not None and fnmatch(name, pattern):
                parent, _, child = name.rpartition(".")
                owner = model.get_submodule(parent) if parent else model
                setattr(owner, child, style.build(module, group))
    return model


def apply_tensor_parallel(model: nn.Module, group: Group, sequence_parallel: bool = False) -> nn.Module:
    """Cut ``model`` (a ``labkit.model.GPT``, or a pipeline stage of one) for this tp rank, in place.

    Raises ValueError when heads, ffn size or padded vocabulary do not divide by the tp size.
    """
    cfg, t = model.cfg, group.size
    divide(cfg.num_attention_heads, t, "num_attention_heads")  # each tp rank needs whole heads
    divide(cfg.ffn_hidden_size, t, "ffn_hidden_size")
    divide(cfg.vocab_size, t, "padded vocab_size")
    shared = cfg.moe_shared_expert_intermediate_size
    if shared:
        divide(shared, t, "moe_shared_expert_intermediate_size")
    return apply_plan(model, tp_plan(sequence_parallel, shared_experts=bool(shared)), group)

"""The tensor-parallel plan: which ROLE becomes which parallel module, and how each parameter is cut.

Chapters "Tensor parallelism" and "Sequence parallelism". Like torchtitan's ``parallelize_llama``
(a dict of styles) and picotron's ``apply_tensor_parallel``, the dense model (labkit/model.py) is
not rewritten: each module tagged with a role (``labkit.modules``) is swapped or tagged by the
style of its role, whatever its class (an RMSNorm is a "norm" like a LayerNorm). For each
parameter the style also refines the shard plan (``labkit.shard_plan``): the rows or columns this
rank keeps, and the parameters replicated over tp (norms, row-parallel biases), whose gradients
are partial sums under sequence parallelism. The book prints the plans with and without SP side
by side (:func:`describe`).

    plan = apply(chunks, groups, cfg, plan)              # labkit.parallelize: refines the ShardPlan
    apply_tensor_parallel(model, groups["tp"], sequence_parallel=True)   # the one-liner (a model)

Fused weights are cut as Megatron cuts them: a query group's [q | k | v] rows stay together, and
with fewer groups than tp ranks each rank holds its query heads and a copy of its group's K and V
(summed over the ranks sharing it); SwiGLU's fc1 = [gate; up] gives rank r [gate_r; up_r].
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from torch import nn

from .. import roles, shard_plan as sp_
from ..groups import Group
from ..param_attrs import tag
from .layers import ColumnParallelLinear, RowParallelLinear, divide
from .sequence_parallel import ScatterToSequence
from .vocab_parallel import VocabParallelCrossEntropyLoss, VocabParallelEmbedding

# where the roles sit in labkit's GPT, in forward order (the book's table; plans are keyed by role)
WHERE = [("embedding.word_embeddings", "embedding"), ("embedding.to_sequence_shard", "sequence_shard"),
         ("decoder.layers.*.input_layernorm", "norm"), ("decoder.layers.*.self_attention.linear_qkv", "qkv"),
         ("decoder.layers.*.self_attention.linear_proj", "proj"), ("decoder.layers.*.pre_mlp_layernorm", "norm"),
         ("decoder.layers.*.mlp.linear_fc1", "fc1"), ("decoder.layers.*.mlp.linear_fc2", "fc2"),
         ("decoder.final_layernorm", "norm"), ("output_layer", "output"), ("loss_fn", "loss")]


@dataclass(frozen=True)
class Style:
    """What the plan does to a module of one role: a sentence for the book, how its parameters are
    cut (``shard(module, t, r, plan entries) -> entries``), and the builder of its replacement
    (``build(module, group, entries) -> module``)."""

    what: str
    shard: Callable
    build: Callable


def _rows(m, t: int, r: int):
    """The output rows a column-parallel module keeps: a fused QKV's groups, SwiGLU's [gate_r; up_r]."""
    if hasattr(m, "qkv_layout"):
        return sp_.qkv(*m.qkv_layout, t, r)
    n = m.weight.shape[0]
    if getattr(m, "stack", 1) > 1:
        divide(n // m.stack, t, "ffn_hidden_size")
        return sp_.stacked(n, m.stack, t, r)
    divide(n, t, "output features")
    return sp_.contiguous(n, t, r)


def _column(m, t, r, e):
    if m.weight is None:                                    # tied output layer: the embedding's rows
        return e
    blocks = _rows(m, t, r)
    return {k: v.cut_along(0, blocks, "tp") for k, v in e.items()}


def _row(sp: bool):
    def shard(m, t, r, e):
        cols = sp_.contiguous(m.weight.shape[1], t, r)
        divide(m.weight.shape[1], t, "input features")
        out = {"weight": e["weight"].cut_along(1, cols, "tp")}
        if "bias" in e:   # added once, after the sum: replicated; under SP each rank adds its positions
            out["bias"] = e["bias"].with_replicas("tp", r, t, summed=sp)
        return out
    return shard


def _replicated(sp: bool):
    return lambda m, t, r, e: {k: v.with_replicas("tp", r, t, summed=sp) for k, v in e.items()}


def _same(m, g, e):
    return m


def _vocab(m, t, r, e):
    divide(m.weight.shape[0], t, "padded vocab_size")
    return {"weight": e["weight"].cut_along(0, sp_.contiguous(m.weight.shape[0], t, r), "tp")}


def _words(role: str, sp: bool) -> str | None:
    """What the plan does to a role, as the book prints it (None: say it from the cut)."""
    col, row = ("g (all-gather seq) -> column", "row -> g-bar (reduce-scatter seq)") if sp else \
        ("f -> column", "row -> f-bar (all-reduce)")
    return {"embedding": "vocab rows V/t -> f-bar (all-reduce)",
            "position": "replicated, added before the SP scatter" if sp else "replicated",
            "sequence_shard": "+ positions, keep my s/t" if sp else "+ positions, replicated",
            "norm": "shard [b, s/t, h], grads summed" if sp else "replicated [b, s, h]",
            "qk_norm": "replicated, my heads, grads summed over tp",
            "qkv": col + ", heads a/t", "proj": row, "fc1": col + ", 4h/t", "fc2": row,
            "output": ("g (all-gather seq)" if sp else "f") + " -> vocab rows V/t",
            "loss": "vocab-parallel cross-entropy"}.get(role)


def _style(r: roles.Role, sp: bool) -> Style:
    """The style of role ``r``, from its cut and its tp sum (labkit.roles)."""
    what = _words(r.name, sp) or f"{r.cut}, {r.what}"
    if r.cut == "column":
        return Style(what, _column, lambda m, g, e: ColumnParallelLinear.from_dense(
            m, g, e.get("weight"), sequence_parallel=sp))
    if r.cut == "row":
        return Style(what, _row(sp), lambda m, g, e: RowParallelLinear.from_dense(
            m, g, e.get("weight"), sequence_parallel=sp))
    if r.cut == "vocab":
        return Style(what, _vocab, lambda m, g, e: VocabParallelEmbedding.from_dense(m, g))
    if r.cut == "replicated":
        return Style(what, _replicated(r.summed_over_tp(sp)), _same)
    if r.cut == "sequence":
        return Style(what, lambda m, t, r_, e: e, (lambda m, g, e: ScatterToSequence(g)) if sp else _same)
    if r.cut == "loss":
        return Style(what, lambda m, t, r_, e: e, lambda m, g, e: VocabParallelCrossEntropyLoss(g))
    raise ValueError(f"role {r.name!r}: the tensor-parallel plan has no style for cut {r.cut!r}")


def tp_plan(sequence_parallel: bool = False) -> dict[str, Style]:
    """{role: Style} for every role the TP plan cuts (``labkit.roles``: plan "tp" and a cut),
    applied in module order by :func:`apply` (to a model, a stage or one ``TransformerLayer``: roles
    are found wherever they are). The other roles are other plans' (the routed experts
    and the router the expert-parallel plan's, the core attention the CP plan's)."""
    return {r.name: _style(r, sequence_parallel) for r in roles.ROLES.values()
            if r.plan == "tp" and r.cut != "none"}


def describe(plan: dict[str, Style]) -> dict[str, str]:
    """{where a role sits in labkit's GPT: what happens}: the plan as the book prints it (the
    learned position table is "+ positions" of the sequence shard's line)."""
    return {where: plan[role].what for where, role in WHERE if role in plan}


def _local_heads(attn: nn.Module, t: int) -> None:
    """The heads and query groups one tp rank's attention computes (a group per rank at least)."""
    attn.num_attention_heads = divide(attn.num_attention_heads, t, "num_attention_heads")
    attn.num_query_groups = max(1, attn.num_query_groups // t)


def apply_plan(model: nn.Module, styles: dict[str, Style], group: Group,
               plan: sp_.ShardPlan | None = None) -> nn.Module:
    """Replace or tag every module whose role has a style, refining ``plan`` in place (a fresh one
    made from ``model``'s parameters if None); returns ``model``. Megatron's tags come from the plan."""
    plan = sp_.initial(model) if plan is None else plan
    roles.of_parameters(model)               # fails closed: a parameter with no role, a role not in the table
    t, r = group.size, group.rank
    for name, module in list(model.named_modules()):
        style = styles.get(getattr(module, "role", None))
        if style is None:
            continue
        prefix = name + "." if name else ""
        entries = {k: plan[prefix + k] for k, _ in module.named_parameters(recurse=False)}
        entries = style.shard(module, t, r, entries)
        new = style.build(module, group, entries)
        new.role = module.role
        if new is not module:
            parent, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent) if parent else model, child, new)
        if module.role == "qkv":
            _local_heads(model.get_submodule(name.rpartition(".")[0]), t)
        plan.update({prefix + k: v for k, v in entries.items()})
    for name, p in model.named_parameters():
        tag(p, **plan[name].tags())
    return model


def apply(chunks: list, groups: dict[str, Group], cfg, plan: sp_.ShardPlan) -> sp_.ShardPlan:
    """Step 2 of ``labkit.parallelize``: cut every chunk for this tp rank; returns the refined plan."""
    for chunk in chunks:
        apply_plan(chunk, tp_plan(cfg.sequence_parallel), groups["tp"], plan)
    return plan


def apply_tensor_parallel(model: nn.Module, group: Group, sequence_parallel: bool = False) -> nn.Module:
    """Cut ``model`` (a ``labkit.model.GPT``, or a pipeline stage of one) for this tp rank, in place;
    returns it. Raises ValueError when heads, ffn size or padded vocabulary do not divide by t."""
    cfg, t = model.cfg, group.size
    divide(cfg.num_attention_heads, t, "num_attention_heads")  # each tp rank needs whole heads
    divide(cfg.ffn_hidden_size, t, "ffn_hidden_size")
    divide(cfg.vocab_size, t, "padded vocab_size")
    apply_plan(model, tp_plan(sequence_parallel), group)
    return model

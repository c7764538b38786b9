"""Tensor and sequence parallelism written as PyTorch's own plan: a dict from module name to a
``ParallelStyle``, applied by ``torch.distributed.tensor.parallel.parallelize_module`` (chapter
"From labkit to PyTorch-native").

It is labkit's ``tensor_parallel/plan.py`` in DTensor's words. Both are keyed by ROLE (the tag
``labkit.modules`` puts on every module), never by class or name, and both read the role's row of
``labkit.roles`` (its cut, its native style; a role with no native style is refused, named), so GPT-2 and the Llama family (RMSNorm, SwiGLU, RoPE, GQA) are cut by the
same lines:

    role (labkit's style)               this plan (DTensor)                       collective
    embedding (vocab rows)              RowwiseParallel on the nn.Embedding       all-reduce (SP: reduce-scatter)
    qkv, fc1 (column-parallel)          ColwiseParallel                           - (SP: all-gather in front)
    proj, fc2 (row-parallel)            RowwiseParallel                           all-reduce (SP: reduce-scatter)
    norm under SP                       SequenceParallel                          - (grads summed over tp)
    qk_norm (per head, always summed)   SequenceParallel(sequence_dim=1): heads   - (grads summed over tp)
    output + loss (vocab-parallel)      ColwiseParallel-like, ``loss_parallel()`` 3 all-reduces of [b*s]
    the parent of qkv / of fc1, SP      PrepareModuleInput (Shard(1) -> Replicate) all-gather

torchtitan's ``parallelize_llama.apply_tp`` is the model (d0ed9b42): the blocks' inputs are
re-laid out by ``PrepareModuleInput`` (the attention's second input, RoPE's positions, passes
through: ``(Shard(1), None)``), the norms run on sequence shards, and the residual stream stays a
local tensor [b, s/t, h]. Parameters become DTensors; their gradients come back complete, because
DTensor inserts the reductions Megatron writes by hand (the SP norm sums, the conjugate f/g).

WHICH rows a rank holds is labkit's shard plan (``labkit.shard_plan``), asked through labkit's own
styles: a contiguous 1/t is DTensor's ``Shard(dim)``; a fused weight whose rank-r part is several
blocks (SwiGLU's fc1 = [gate; up] -> [gate_r; up_r]) is stored with its rows in rank order first,
so that ``Shard(0)`` of it is exactly Megatron's cut (``dense_order`` remembers the order, for the
reassembled gradients); a block held by several ranks (K/V of a query group shared by tp ranks,
``num_query_groups < t``) has no DTensor placement and is refused.
"""
from __future__ import annotations

import inspect
from functools import partial

import torch
from torch import nn
from torch.distributed.tensor import Replicate, Shard, distribute_module, distribute_tensor
from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, PrepareModuleOutput,
                                               RowwiseParallel, SequenceParallel, parallelize_module)

from .. import roles, shard_plan as sp_


class OutputParallel(ColwiseParallel):
    """ColwiseParallel for labkit's ``OutputLayer``: logits = x W^T with W [V, h] cut by rows
    (vocabulary), so the logits come out [b, s, V/t] (``Shard(-1)``).

    The layer may hold its own weight (untied) or receive the word embeddings' as its second
    argument (tied: already ``Shard(0)`` over the vocabulary, from RowwiseParallel on the
    embedding). torchtitan's output is an ``nn.Linear`` and takes ColwiseParallel directly; this
    subclass only accepts the other module class and keeps the tied weight argument.
    """

    def _partition_output_fn(self, name, module, device_mesh):
        if module.weight is not None:   # untied: cut this layer's own weight by vocabulary rows
            module.register_parameter("weight", nn.Parameter(
                distribute_tensor(module.weight, device_mesh, [Shard(0)], src_data_rank=None)))

    @staticmethod
    def _prepare_output_layer_input(input_layouts, desired, mod, inputs, device_mesh):
        x = ColwiseParallel._prepare_input_fn(input_layouts, desired, mod, inputs[:1], device_mesh)
        return (x, *inputs[1:])             # keep the tied weight argument

    def _apply(self, module, device_mesh):
        return distribute_module(
            module, device_mesh, self._partition_output_fn,
            partial(self._prepare_output_layer_input, self.input_layouts, self.desired_input_layouts),
            partial(self._prepare_output_fn, self.output_layouts, self.use_local_output))


# the dim DTensor cuts each parameter of a role's cut along (None: Replicate); checked against
# labkit's shard plan for every parameter before anything is cut (:func:`dense_orders`)
CUT_DIMS = {"column": {"weight": 0, "bias": 0}, "vocab": {"weight": 0}, "row": {"weight": 1, "bias": None},
            "replicated": {"weight": None, "bias": None}}


def role_styles(sequence_parallel: bool = False, loss_parallel: bool = False) -> dict:
    """{role: ParallelStyle} for the roles that need one (``labkit.roles``: each role names its
    native style; "seam" and the norms without SP need none: their modules stay as they are)."""
    residual = Shard(1) if sequence_parallel else Replicate()     # activations [b, s, h]: seq is dim 1
    by_native = {
        # vocab-parallel embedding: rows of the table cut over tp, partial sums reduced (under SP
        # reduce-scattered over the sequence; the learned positions are then cut to match)
        "embedding": RowwiseParallel(input_layouts=Replicate(), output_layouts=residual),
        "colwise": ColwiseParallel(),             # qkv: whole query groups [b, s, (n+2g)d/t]; fc1: [gate_r; up_r]
        "rowwise": RowwiseParallel(output_layouts=residual),
        "output": OutputParallel(input_layouts=residual, output_layouts=Shard(-1) if loss_parallel
                                 else Replicate(), use_local_output=not loss_parallel),
        # QK-layernorm: q/k [b, n/t, s, d] are this rank's heads (dim 1): the weight [d] replicated,
        # its gradient (Partial: each rank saw its heads) summed over tp, with or without SP
        "heads": SequenceParallel(sequence_dim=1, use_local_output=True),
    }
    if sequence_parallel:
        by_native["sequence_parallel"] = SequenceParallel()               # norms on [b, s/t, h]
        by_native["position"] = PrepareModuleOutput(output_layouts=Replicate(),
                                                    desired_output_layouts=Shard(0))   # [s, h] -> [s/t, h]
    return {r.name: by_native[r.native] for r in roles.ROLES.values() if r.native in by_native}


def check_roles(model: nn.Module) -> None:
    """Fail closed: ValueError naming the module for a parameter whose module has no role, and for a
    role whose native style is None (``labkit.roles``: the native path cannot express it)."""
    roles.of_parameters(model)
    for name, module in model.named_modules():
        r = getattr(module, "role", None)
        if r is not None and roles.get(r, name).native is None:
            raise ValueError(f"module {name!r} has role {r!r}, which the native tensor-parallel plan "
                             f"cannot express (labkit.roles: no DTensor style)")


def gather_input(module: nn.Module) -> PrepareModuleInput:
    """SP: the block that holds a column-parallel linear needs its whole input (all-gather the
    sequence); its other positional inputs (the attention's ``position_ids``) pass through. The
    gathered input stays a DTensor into the column-parallel linear, so its gradient (Partial) is
    reduce-scattered back to [b, s/t, h]; a local tensor there would be re-wrapped as Replicate and
    all-reduced instead (twice the bytes)."""
    params = [p for p in inspect.signature(module.forward).parameters.values()
              if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    rest = (None,) * (len(params) - 1)
    return PrepareModuleInput(input_layouts=(Shard(1), *rest), desired_input_layouts=(Replicate(), *rest))


def tensor_parallel_plan(model: nn.Module, sequence_parallel: bool = False, loss_parallel: bool = False) -> dict:
    """{module name: ParallelStyle} for the modules ``model`` (the dense GPT or a pipeline stage)
    holds, found by their roles, in module order."""
    check_roles(model)
    styles, plan = role_styles(sequence_parallel, loss_parallel), {}
    for name, module in model.named_modules():
        r = getattr(module, "role", None)
        if sequence_parallel and r in ("qkv", "fc1"):            # the attention / the MLP before it
            parent = name.rpartition(".")[0]
            plan[parent] = gather_input(model.get_submodule(parent))
        if r in styles:
            plan[name] = styles[r]
    return plan


def dense_orders(model: nn.Module, t: int, sequence_parallel: bool = False) -> dict:
    """{parameter name: (dim, blocks)}: the dense rows in the order DTensor's ``Shard(dim)`` must see
    them so that rank r's slice is labkit's shard-plan entry for rank r, for each parameter whose
    rank-r part is not one contiguous 1/t (SwiGLU's fc1). Raises ValueError for a cut DTensor
    cannot express (K/V held by several tp ranks), or a role whose style cuts another dim than
    labkit's plan."""
    from ..tensor_parallel.plan import tp_plan
    labkit_styles, out = tp_plan(sequence_parallel), {}
    for name, module in model.named_modules():
        role = getattr(module, "role", None)
        if role not in labkit_styles or roles.get(role, name).cut not in CUT_DIMS:
            continue
        prefix = name + "." if name else ""
        dense = {k: sp_.ParamShard(prefix + k, tuple(p.shape)) for k, p in module.named_parameters(recurse=False)}
        per_rank = [labkit_styles[role].shard(module, t, r, dict(dense)) for r in range(t)]
        for k in dense:
            entries = [e[k] for e in per_rank]
            want = CUT_DIMS[roles.ROLES[role].cut][k]
            if want is None:
                if entries[0].cut is not None:
                    raise ValueError(f"{prefix + k}: labkit's plan cuts it (dim {entries[0].dim}), the "
                                     f"DTensor style for role {role!r} replicates it")
                continue
            if entries[0].dim != want:
                raise ValueError(f"{prefix + k}: labkit's plan cuts dim {entries[0].dim}, the DTensor "
                                 f"style for role {role!r} dim {want}")
            if all(e.even_shard() == (want, r) for r, e in enumerate(entries)):
                continue                                          # Shard(want) as it is
            if any(b.replicas for e in entries for b in e.blocks):
                raise ValueError(f"{prefix + k}: labkit's plan gives some rows to several tp ranks "
                                 f"(its copies of a query group's K/V when num_query_groups < "
                                 f"tensor_model_parallel_size), which no DTensor placement expresses "
                                 f"(Megatron's own layout, Shard(0) plus an all-gather of the QKV "
                                 f"output, is not implemented here)")
            out[prefix + k] = (want, tuple(b for e in entries for b in e.blocks))
    return out


def local_heads(model: nn.Module, t: int) -> None:
    """Each attention computes its rank's heads and query groups (labkit's attention reads them from
    its attributes, where torchtitan's infers them from the shape)."""
    for name, module in model.named_modules():
        if getattr(module, "role", None) == "qkv":
            n, g, _ = module.qkv_layout
            if g % t:
                raise ValueError(f"num_query_groups {g} is not divisible by tensor_model_parallel_size "
                                 f"{t}: the native plan keeps whole query groups on each rank")
            attn = model.get_submodule(name.rpartition(".")[0])
            attn.num_attention_heads, attn.num_query_groups = n // t, g // t


@torch.no_grad()
def apply_tensor_parallel(model, tp_mesh, sequence_parallel: bool = False, loss_parallel: bool = False) -> dict:
    """Cut ``model`` (the dense GPT or one pipeline stage) over ``tp_mesh`` in place; returns the
    plan it applied. Fused weights are reordered first (:func:`dense_orders`), their order kept in
    ``module.dense_order``."""
    t = tp_mesh.size()
    check_roles(model)
    if model.output_layer is not None and model.embedding is None and model.output_layer.weight is None:
        raise ValueError("a pipeline stage with a tied output layer but no embedding: untie them "
                         "(untie_embeddings_and_output_weights=True)")
    orders = dense_orders(model, t, sequence_parallel)
    for name, (dim, blocks) in orders.items():
        prefix, _, k = name.rpartition(".")
        module = model.get_submodule(prefix)
        p = getattr(module, k)
        p.copy_(torch.cat([p.narrow(dim, b.start, b.size) for b in blocks], dim=dim))
        module.dense_order = {**getattr(module, "dense_order", {}), k: (dim, blocks)}
    local_heads(model, t)
    plan = tensor_parallel_plan(model, sequence_parallel, loss_parallel)
    # every rank built the same model from one seed: cut locally (src_data_rank=None), no broadcast
    parallelize_module(model, tp_mesh, plan, src_data_rank=None)
    return plan


def dense_grad(model: nn.Module, name: str, g: torch.Tensor) -> torch.Tensor:
    """The full gradient ``g`` of parameter ``name`` in the dense model's row order."""
    prefix, _, k = name.rpartition(".")
    order = getattr(model.get_submodule(prefix), "dense_order", {}).get(k)
    if order is None:
        return g
    dim, blocks = order
    parts, at = [], 0
    for b in blocks:
        parts.append((b.start, b.stop, g.narrow(dim, at, b.size)))
        at += b.size
    return sp_.assemble(tuple(g.shape), dim, parts)


def side_by_side(sequence_parallel: bool = False) -> list[dict]:
    """One row per module of a layer and of the model's ends: labkit's plan (what its module swap
    does, ``tensor_parallel.plan.describe``) beside the ParallelStyle this plan gives it."""
    from ..model import GPT, GPTConfig
    from ..tensor_parallel.plan import describe, tp_plan
    plan = tensor_parallel_plan(GPT(GPTConfig(num_layers=1), seed=0), sequence_parallel, loss_parallel=True)
    ours = {k.replace("decoder.layers.0.", "decoder.layers.*."): v for k, v in plan.items()}
    rows = []
    for name, what in describe(tp_plan(sequence_parallel)).items():
        style = ours.get(name)
        if name == "loss_fn":
            code = "with loss_parallel(): cross_entropy"
        elif name == "embedding.to_sequence_shard" and sequence_parallel:
            code = "- (the positions are cut instead)"
        else:
            code = _short(style) if style else "-"
        rows.append({"module": name, "labkit": what, "PyTorch": code})
    extra = [k for k in ours if k not in {r["module"] for r in rows}]
    rows += [{"module": k, "labkit": "-", "PyTorch": _short(ours[k])} for k in extra]
    for r in rows:                                   # shorter for the page: "layers.*.mlp"
        r["module"] = r["module"].replace("decoder.layers.", "layers.").replace("decoder.", "")
    return rows


def _short(style) -> str:
    """A style as code, with only the arguments that differ from its defaults."""
    name = type(style).__name__
    if isinstance(style, (ColwiseParallel, RowwiseParallel)):
        default = type(style)() if not isinstance(style, OutputParallel) else ColwiseParallel()
        args = [f"{k}={_placement(getattr(style, a))}" for k, a in (("input_layouts", "input_layouts"),
                                                                    ("output_layouts", "output_layouts"))
                if getattr(style, a) != getattr(default, a)]
        if style.use_local_output != default.use_local_output:
            args.append(f"use_local_output={style.use_local_output}")
        return f"{name}({', '.join(args)})"
    if isinstance(style, PrepareModuleInput):
        return (f"PrepareModuleInput({_placement(style.input_layouts)} -> "
                f"{_placement(style.desired_input_layouts)})")
    if isinstance(style, PrepareModuleOutput):
        return (f"PrepareModuleOutput({_placement(style.output_layouts)} -> "
                f"{_placement(style.desired_output_layouts)})")
    return f"{name}()"


def _placement(p) -> str:
    """``Shard(1)``, ``Replicate()``; a tuple of several as ``(Shard(1), None)``."""
    if isinstance(p, tuple) and len(p) > 1:
        return "(" + ", ".join(_placement(x) for x in p) + ")"
    p = p[0] if isinstance(p, tuple) else p
    if p is None:
        return "None"
    return "Replicate()" if isinstance(p, Replicate) else f"Shard({p.dim})"

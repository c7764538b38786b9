"""Tensor and sequence parallelism written as PyTorch's own plan: a dict from module name to a
``ParallelStyle``, applied by ``torch.distributed.tensor.parallel.parallelize_module`` (chapter
"From labkit to PyTorch-native").

It is labkit's ``tensor_parallel/plan.py`` in DTensor's words, module by module:

    labkit (tensor_parallel/)            this plan (DTensor)                       collective
    VocabParallelEmbedding               RowwiseParallel on the nn.Embedding       all-reduce (SP: reduce-scatter)
    ColumnParallelLinear (qkv, fc1)      ColwiseParallel                           - (SP: all-gather in front)
    RowParallelLinear (proj, fc2)        RowwiseParallel                           all-reduce (SP: reduce-scatter)
    SP LayerNorms (sequence_parallel)    SequenceParallel                          - (grads summed over tp)
    vocab-parallel output + loss         ColwiseParallel-like, ``loss_parallel()`` 3 all-reduces of [b*s]

torchtitan's ``parallelize_llama.apply_tp`` is the model (d0ed9b42): the layers' inputs are
re-laid out by ``PrepareModuleInput`` on the attention and MLP modules, the norms run on sequence
shards, and the residual stream stays a local tensor [b, s/t, h]. Parameters become DTensors
(``Shard(0)`` for column-parallel weights and biases, ``Shard(1)`` for row-parallel weights,
``Replicate()`` for norms and row-parallel biases); their gradients come back complete, because
DTensor inserts the reductions Megatron writes by hand (the SP norm sums, the conjugate f/g).

Only the model's module names are read (``decoder.layers.<i>.self_attention.linear_qkv``, ...),
so a model with the same names is cut the same way.
"""
from __future__ import annotations

from functools import partial

from torch import nn
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, PrepareModuleOutput,
                                               RowwiseParallel, SequenceParallel, parallelize_module)
from torch.distributed.tensor import distribute_module


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


def tensor_parallel_plan(layer_names, sequence_parallel: bool = False,
                         loss_parallel: bool = False) -> dict:
    """{module name: ParallelStyle} for the GPT's modules; ``layer_names`` are the keys of
    ``decoder.layers`` this model (or pipeline stage) holds; the embedding, final norm and output
    entries apply to a model that holds them (:func:`apply_tensor_parallel` drops the others)."""
    seq = Shard(1)                                   # activations [b, s, h]: the sequence is dim 1
    residual = seq if sequence_parallel else Replicate()
    plan = {
        # vocab-parallel embedding: rows of the table cut over tp, partial sums reduced. Under SP
        # the sum is reduce-scattered over the sequence and the positions are cut to match.
        "embedding.word_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=residual),
        "output_layer": OutputParallel(input_layouts=residual, output_layouts=Shard(-1),
                                       use_local_output=not loss_parallel),
    }
    if sequence_parallel:
        plan["embedding.position_embeddings"] = PrepareModuleOutput(
            output_layouts=Replicate(), desired_output_layouts=Shard(0))     # [s, h] -> [s/t, h]
        plan["decoder.final_layernorm"] = SequenceParallel()
    if not loss_parallel:                            # logits gathered: [b, s, V] on every rank
        plan["output_layer"].output_layouts = (Replicate(),)
    for i in layer_names:
        pre = f"decoder.layers.{i}"
        plan.update({
            f"{pre}.self_attention.linear_qkv": ColwiseParallel(),             # heads cut: [b, s, 3h/t]
            f"{pre}.self_attention.linear_proj": RowwiseParallel(output_layouts=residual),
            f"{pre}.mlp.linear_fc1": ColwiseParallel(),                        # [b, s, 4h/t]
            f"{pre}.mlp.linear_fc2": RowwiseParallel(output_layouts=residual),
        })
        if sequence_parallel:                       # norms on [b, s/t, h]; all-gather into the block
            plan.update({
                f"{pre}.input_layernorm": SequenceParallel(),
                f"{pre}.pre_mlp_layernorm": SequenceParallel(),
                # the gathered input stays a DTensor into the column-parallel linear, so its
                # gradient (Partial) is reduce-scattered back to [b, s/t, h]; a local tensor here
                # would be re-wrapped as Replicate and all-reduced instead (twice the bytes)
                f"{pre}.self_attention": PrepareModuleInput(
                    input_layouts=(seq,), desired_input_layouts=(Replicate(),)),
                f"{pre}.mlp": PrepareModuleInput(input_layouts=(seq,), desired_input_layouts=(Replicate(),)),
            })
    return plan


def apply_tensor_parallel(model, tp_mesh, sequence_parallel: bool = False,
                          loss_parallel: bool = False) -> dict:
    """Cut ``model`` (the dense GPT or one pipeline stage) over ``tp_mesh`` in place; returns the
    plan it applied (only the entries for modules the model holds)."""
    names = {n for n, _ in model.named_modules()}
    plan = {k: v for k, v in tensor_parallel_plan(list(model.decoder.layers.keys()), sequence_parallel,
                                                  loss_parallel).items() if k in names}
    if model.output_layer is not None and model.embedding is None and model.output_layer.weight is None:
        raise ValueError("a pipeline stage with a tied output layer but no embedding: untie them "
                         "(untie_embeddings_and_output_weights=True)")
    # every rank built the same model from one seed: cut locally (src_data_rank=None), no broadcast
    parallelize_module(model, tp_mesh, plan, src_data_rank=None)
    return plan


def is_dtensor(t) -> bool:
    return isinstance(t, DTensor)


def side_by_side(sequence_parallel: bool = False) -> list[dict]:
    """One row per module of a layer and of the model's ends: labkit's plan (what its module swap
    does, ``tensor_parallel.plan.describe``) beside the ParallelStyle this plan gives it."""
    from ..tensor_parallel.plan import describe, tp_plan
    ours = tensor_parallel_plan(["*"], sequence_parallel, loss_parallel=True)
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
    p = p[0] if isinstance(p, tuple) else p
    return "Replicate()" if isinstance(p, Replicate) else f"Shard({p.dim})"

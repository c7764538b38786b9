"""labkit's dense weights into Megatron-Core's GPTModel chunks, and Megatron's gradients back
under labkit's dense names (the oracle compares names, so the map is the whole contract).

labkit's model carries Megatron-Core's module names and layouts (labkit/model.py), so a name maps
to itself except for the layer number (a Megatron chunk numbers its layers from 0; the global
number is ``layer.layer_number - 1``) and the cut of a tensor-parallel parameter:

    Megatron (per TP rank r of t)                 dense rows / columns it holds
    linear_qkv  [(n+2g)d/t, h]                    rows of query groups r*g/t .. (r+1)*g/t: labkit's
                                                  fused QKV is already per group [q.. | k | v]
    linear_fc1  [2f/t, h] (SwiGLU)                [gate_r; up_r]: rows r of the gate, r of the up
    other ``partition_dim`` 0 (fc1, word emb.,    rows r*N/t .. (r+1)*N/t
      output layer, qkv/fc1 biases)
    linear_proj, linear_fc2  [h, N/t]             columns r*N/t .. (r+1)*N/t (``partition_dim`` 1)
    norms, position table, row-parallel biases    the whole tensor (replicated over TP)
    experts (MoE layers: mlp.experts.local_experts.i)
      number i of ep rank e                       expert e * E/ep + i of the dense model
      linear_fc1 / linear_fc2                     cut as above over the EXPERT tensor-parallel
                                                  group (expert_tensor_parallel_size), not TP's
    router weight [E, h]                          the whole tensor (Megatron tags it
                                                  sequence_parallel under SP: summed over TP)

The gradients come back the same way: each TP-cut gradient is all-gathered over its TP group (a
bookkeeping gather outside the counted step), put in the dense order, and reported by the ranks
at coordinate 0 of every axis that holds a copy, as ``(ParamShard, tensor)`` pairs that
``labkit.parallelize.assemble`` merges, the same as labkit's and the native runs'.
"""
from __future__ import annotations

import re

import torch
import torch.distributed as dist

_LAYER = re.compile(r"^decoder\.layers\.(\d+)\.")
_EXPERT = re.compile(r"\.mlp\.experts\.local_experts\.(\d+)\.")


def is_expert(name: str) -> bool:
    """A routed expert's parameter (not the router, not a shared expert)?"""
    return _EXPERT.search(name) is not None


def dense_name(chunk, name: str) -> str:
    """The dense model's name of Megatron parameter ``name`` of ``chunk`` (a GPTModel): the global
    layer number, and a local expert's global number (expert-parallel rank x experts per rank)."""
    from megatron.core import parallel_state as ps
    name = name.removeprefix("module.")
    m = _LAYER.match(name)
    if m:
        layer = chunk.decoder.layers[int(m.group(1))]
        name = f"decoder.layers.{layer.layer_number - 1}." + name[m.end():]
    e = _EXPERT.search(name)
    if e:
        per_rank = chunk.config.num_moe_experts // ps.get_expert_model_parallel_world_size()
        index = ps.get_expert_model_parallel_rank() * per_rank + int(e.group(1))
        name = f"{name[:e.start()]}.mlp.experts.local_experts.{index}.{name[e.end():]}"
    return name


def _tp(param, name: str = ""):
    """(group, rank, size) of the tensor-parallel cut of ``param``, or None if replicated; an
    expert's cut is over the expert tensor-parallel group."""
    from megatron.core import parallel_state as ps
    if not getattr(param, "tensor_model_parallel", False):
        return None
    g = ps.get_expert_tensor_parallel_group() if is_expert(name) else ps.get_tensor_model_parallel_group()
    size = dist.get_world_size(g)
    return (g, dist.get_rank(g), size) if size > 1 else None


def _is_gated_fc1(param, name: str, chunk) -> bool:
    return chunk.config.gated_linear_unit and name.endswith(("linear_fc1.weight", "linear_fc1.bias"))


def cut(dense: torch.Tensor, param, name: str, chunk) -> torch.Tensor:
    """This rank's piece of the dense tensor ``dense`` for Megatron parameter ``param``."""
    tp = _tp(param, name)
    if tp is None:
        return dense
    _, r, t = tp
    dim = param.partition_dim
    if _is_gated_fc1(param, name, chunk):                   # [gate; up] -> [gate_r; up_r]
        return torch.cat([half.chunk(t, dim)[r] for half in dense.chunk(2, dim)], dim)
    return dense.chunk(t, dim)[r]


def uncut(local: torch.Tensor, param, name: str, chunk) -> torch.Tensor:
    """The dense tensor from every TP rank's ``local`` piece (an all-gather over the TP group)."""
    tp = _tp(param, name)
    if tp is None:
        return local
    g, _, t = tp
    pieces = [torch.empty_like(local) for _ in range(t)]
    dist.all_gather(pieces, local.contiguous(), group=g)
    dim = param.partition_dim
    if _is_gated_fc1(param, name, chunk):                   # [gate_r; up_r] per rank -> [gate; up]
        halves = [p.chunk(2, dim) for p in pieces]
        return torch.cat([torch.cat([h[0] for h in halves], dim), torch.cat([h[1] for h in halves], dim)], dim)
    return torch.cat(pieces, dim)


def _megatron_params(chunks):
    """(chunk, Megatron name, param) of every parameter, the DDP wrapper unwrapped."""
    for wrapped in chunks:
        chunk = getattr(wrapped, "module", wrapped)
        for name, p in chunk.named_parameters():
            yield chunk, name, p


def _dense_of(chunk, name: str) -> str:
    """The dense name, a tied output layer (last stage, pp > 1) read as the word embeddings."""
    dn = dense_name(chunk, name)
    if dn == "output_layer.weight" and chunk.share_embeddings_and_output_weights:
        return "embedding.word_embeddings.weight"
    return dn


@torch.no_grad()
def load(chunks, dense_model) -> None:
    """Copy labkit's dense weights into this rank's Megatron chunks (each rank its cut)."""
    dense = dict(dense_model.named_parameters())
    for chunk, name, p in _megatron_params(chunks):
        p.copy_(cut(dense[_dense_of(chunk, name)], p, name, chunk))


def _reports(param, chunk, name: str) -> bool:
    """Does this rank report ``param``'s gradient (coordinate 0 of every axis holding a copy)? An
    expert's copies are over the expert data-parallel group; each expert-parallel rank reports its
    own experts."""
    from megatron.core import parallel_state as ps
    if name.endswith("output_layer.weight") and chunk.share_embeddings_and_output_weights:
        return False                                        # a copy of the word embeddings (summed)
    if is_expert(name):
        return ps.get_expert_data_parallel_rank() == 0 and ps.get_expert_tensor_parallel_rank() == 0
    return ps.get_data_parallel_rank() == 0 and ps.get_tensor_model_parallel_rank() == 0


def dense_grads(chunks) -> list:
    """[(ParamShard(dense name, shape), gradient)] of what this rank reports, after
    ``finalize_model_grads`` (Megatron's ``main_grad``: averaged over DP, SP norms summed over TP,
    tied embeddings summed over the ends of the pipeline); every rank takes part in the gathers."""
    from ..shard_plan import ParamShard
    out = []
    for chunk, name, p in _megatron_params(chunks):
        g = p.main_grad if getattr(p, "main_grad", None) is not None else p.grad
        full = uncut(g.detach().clone(), p, name, chunk)
        if _reports(p, chunk, name):
            out.append((ParamShard(_dense_of(chunk, name), tuple(full.shape)), full.cpu()))
    return out


def dense_params(chunks) -> list:
    """[(ParamShard, parameter)] as :func:`dense_grads`, of the weights (the distributed
    optimizer's check: its gradients are reduce-scattered, its parameters all-gathered whole)."""
    from ..shard_plan import ParamShard
    out = []
    for chunk, name, p in _megatron_params(chunks):
        full = uncut(p.detach().clone(), p, name, chunk)
        if _reports(p, chunk, name):
            out.append((ParamShard(_dense_of(chunk, name), tuple(full.shape)), full.cpu()))
    return out

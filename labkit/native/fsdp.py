"""Data parallelism through FSDP2 (``torch.distributed.fsdp.fully_shard``), chapter "From labkit to
PyTorch-native".

labkit's ``data_parallel/`` keeps one flat buffer per rank and shards it (ZeRO-1/2/3). FSDP2 cuts
each *parameter* along dim 0 into a DTensor ``Shard(0)`` over the dp mesh, and groups parameters by
the module ``fully_shard`` is called on: one all-gather of the group's weights before its forward
(and, with ``reshard_after_forward=True``, again before its backward), one reduce-scatter of its
gradients after its backward. Called per transformer layer, then on the root for what is left (the
embedding, the final norm, the output layer): torchtitan's ``apply_fsdp``.

    zero_stage 3   reshard_after_forward=True:   AG (fwd) + AG (bwd) + RS per unit and step
    zero_stage 2   reshard_after_forward=False:  AG (fwd)            + RS per unit and step
    zero_stage 0   replicate (FSDP2's machinery, ``Replicate()`` placement): one all-reduce per unit
    HSDP           2-d mesh (dp_replicate, dp_shard): RS over dp_shard, then all-reduce over
                   dp_replicate; AG over dp_shard
    bf16           MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32): the all-gathers move
                   bf16 (half the bytes), the reduce-scatters fp32; the optimizer steps fp32 shards

With TP, the parameters are already DTensors on the tp mesh; ``fully_shard`` over the dp slice of
the same mesh makes them 2-d, (Shard(0) over dp, the TP placement over tp): "FSDP x TP".
"""
from __future__ import annotations

import torch

from .mesh import dp_mesh


def mixed_precision_policy(name: str | None):
    """FSDP2's policy for ``name`` (None: parameters compute in their own dtype)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy
    if name is None:
        return MixedPrecisionPolicy()
    return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)


def apply_data_parallel(part, mesh, zero_stage: int, mixed_precision: str | None = None) -> list:
    """Shard (zero_stage 2/3) or replicate (0) ``part`` over the data-parallel mesh, one unit per
    decoder layer and one for the rest; returns the units' names in the order they are wrapped."""
    from torch.distributed.fsdp import fully_shard
    units = [f"decoder.layers.{i}" for i in part.decoder.layers.keys()] + ["(root)"]
    if zero_stage == 0:
        from torch.distributed._composable.replicate_with_fsdp import replicate
        for layer in part.decoder.layers.values():
            replicate(layer, mesh=mesh["dp"])
        replicate(part, mesh=mesh["dp"])
        return units
    kw = {"mesh": dp_mesh(mesh), "reshard_after_forward": zero_stage == 3,
          "mp_policy": mixed_precision_policy(mixed_precision)}
    for layer in part.decoder.layers.values():
        fully_shard(layer, **kw)
    fully_shard(part, **kw)
    return units

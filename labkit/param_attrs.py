"""Megatron's parameter tags in one table.

The shard plan (``labkit.shard_plan``) is what labkit's engine reads; each parameter also carries
the same facts as Megatron-LM's attributes (``ParamShard.tags()``, set by the plans), so code
written against Megatron's conventions works: ``tensor_parallel/layers.py``
``set_tensor_model_parallel_attributes``, ``sequence_parallel`` in ``transformer/`` modules,
``shared`` / ``shared_embedding`` in ``language_module.py``, ``allreduce`` on expert weights.
:func:`owns` answers "who counts this gradient" from tags alone, by the plan's one rule.
Pure Python: a tag is a plain attribute on the parameter.
"""
from __future__ import annotations

TAGS = {
    "tensor_model_parallel": "sharded over the tp group: each tp rank holds a different slice",
    "partition_dim": "the dim it is cut along: 0 (column-parallel rows, vocabulary rows) or 1 "
                     "(row-parallel columns)",
    "sequence_parallel": "replicated over tp but fed sequence shards (SP norms, row-parallel "
                         "biases): its gradient is summed over the tp group",
    "shared_embedding": "the tied word embedding when the first and the last pipeline stage each "
                        "hold a copy: its gradient is summed over the embedding group",
    "shared": "the last stage's copy of the tied embedding: equal to the first stage's, so not "
              "counted again in the gradient norm (Megatron's param_is_not_shared)",
    "allreduce": "False for expert parameters: averaged over the expert-data-parallel group, not "
                 "over dp x cp",
}


def tag(param, **tags) -> None:
    """Set Megatron's tags on ``param`` (names from :data:`TAGS`)."""
    unknown = set(tags) - set(TAGS)
    if unknown:
        raise ValueError(f"unknown parameter tags {sorted(unknown)}; known: {sorted(TAGS)}")
    for name, value in tags.items():
        setattr(param, name, value)


def is_tp_sharded(param) -> bool:
    return bool(getattr(param, "tensor_model_parallel", False))


def is_expert(param) -> bool:
    """A routed expert's parameter (Megatron tags them ``allreduce=False``)."""
    return getattr(param, "allreduce", True) is False


def owns(param, coords: dict, dp_sharded: bool = False) -> bool:
    """Whether this rank counts its copy of ``param`` in the global gradient norm, from Megatron's
    tags alone (for code that holds tags, not a shard plan; the Engine reads the plan).

    ``coords``: this rank's {"tp", "cp", "dp", ...} (``Topology.coords``), with the expert grid's
    {"etp", "edp"} (``Topology.expert_coords``) when the model has experts. ``dp_sharded``: the
    gradients are sharded over the data-parallel ranks (ZeRO), so each holds a different part.
    The tags are translated into a ``labkit.shard_plan.ParamShard`` and ITS rule decides (one rule):

    * the last pipeline stage's copy of a tied embedding: never (the first stage counts it);
    * a parameter replicated over tp: only on tp rank 0;
    * replicated over dp x cp (no ZeRO): only on dp rank 0, cp rank 0;
    * an expert's: the same two rules on the expert grid (etp rank 0 unless cut over etp; edp
      rank 0 unless ZeRO shards it over edp); the ep ranks hold different experts.
    """
    from .shard_plan import Block, ParamShard
    expert = is_expert(param)
    replicas = []
    if getattr(param, "shared", False):
        replicas.append(("embd", 1, 2))
    if not is_tp_sharded(param):
        axis = "etp" if expert else "tp"
        replicas.append((axis, coords.get(axis, 0), None))
    dp_index = coords.get("edp", 0) if expert else (coords.get("dp", 0) or coords.get("cp", 0))
    entry = ParamShard("param", (1,), blocks=(Block(0, 1, replicas=tuple(replicas)),), dp_index=dp_index,
                       dp="edp" if expert else "dp_cp", expert=expert)
    return bool(entry.owned_ranges(dp_sharded))

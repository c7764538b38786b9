"""Megatron's parameter tags in one table.

The shard plan (``labkit.shard_plan``) is what labkit's engine reads; each parameter also carries
the same facts as Megatron-LM's attributes (``ParamShard.tags()``, set by the plans), so code
written against Megatron's conventions works: ``tensor_parallel/layers.py``
``set_tensor_model_parallel_attributes``, ``sequence_parallel`` in ``transformer/`` modules,
``shared`` / ``shared_embedding`` in ``language_module.py``, ``allreduce`` on expert weights.
Who counts a gradient in the norm is the plan's one rule (``ParamShard.owned_ranges``), not the tags'.
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


def is_expert(param) -> bool:
    """A routed expert's parameter (Megatron tags them ``allreduce=False``)."""
    return getattr(param, "allreduce", True) is False

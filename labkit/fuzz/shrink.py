"""Shrinking: a finding made small, one simplification at a time, while it still fails alike.

Chapter "Finding the bug nobody chose". Hypothesis shrinks by replaying its own byte stream; a
layout here costs seconds to judge, so the shrinker is greedy and domain-aware instead (the
fewest ranks first, then the fewest axes, then the knobs, then the model): each candidate is one
step simpler than the current layout (:func:`candidates`), is refused for free by the rule book
when it is not a valid layout, and is kept when it still fails with the same kind of problem
("grad", "loss", "bytes", "nonfinite", "crash"). It stops at a layout none of whose candidates
fails, or after ``max_runs`` runs: a local minimum, named in the report as such.
"""
from __future__ import annotations

AXES = ("context_parallel_size", "pipeline_model_parallel_size", "tensor_model_parallel_size",
        "expert_model_parallel_size")
AXIS_KNOBS = {"context_parallel_size": ("cp_comm_type",),
              "pipeline_model_parallel_size": ("num_layers_per_virtual_pipeline_stage", "pipeline_schedule"),
              "tensor_model_parallel_size": ("sequence_parallel",),
              "expert_model_parallel_size": ()}
KNOBS = ("hidden_dropout", "recompute_granularity", "zero_stage", "use_distributed_optimizer", "ddp_bucket_size",
         "moe_expert_capacity_factor", "moe_shared_expert_intermediate_size", "moe_token_dispatcher_type",
         "expert_tensor_parallel_size", "group_query_attention", "untie_embeddings_and_output_weights",
         "make_vocab_size_divisible_by", "cp_comm_type", "pipeline_schedule", "sequence_parallel",
         "num_layers_per_virtual_pipeline_stage")
RECOMPUTE = ("recompute_granularity", "recompute_method", "recompute_num_layers", "recompute_modules")
MOE = ("num_experts", "expert_model_parallel_size", "expert_tensor_parallel_size", "moe_router_topk",
       "moe_token_dispatcher_type", "moe_expert_capacity_factor", "moe_shared_expert_intermediate_size")
LLAMA = ("normalization", "swiglu", "position_embedding_type", "add_bias_linear", "ffn_hidden_size",
         "group_query_attention", "num_query_groups")


def _with(layout: dict, world: int | None = None, drop=(), **set_) -> dict:
    c = {k: v for k, v in layout["config"].items() if k not in drop}
    c.update(set_)
    return {**layout, "world_size": world or layout["world_size"], "config": c}


def _dp(layout: dict) -> int:
    c = layout["config"]
    return layout["world_size"] // (c.get("tensor_model_parallel_size", 1) * c.get("context_parallel_size", 1)
                                    * c.get("pipeline_model_parallel_size", 1))


def candidates(layout: dict):
    """Layouts one step simpler than ``layout``, the biggest savings first (fewer ranks)."""
    c, w = layout["config"], layout["world_size"]
    gbs = c.get("global_batch_size")
    dp = _dp(layout)
    if dp > 1:                                         # half the data-parallel ranks, the same microbatches
        yield _with(layout, w // 2, **({"global_batch_size": gbs // 2} if gbs else {}))
    for axis in AXES:
        n = c.get(axis, 1)
        if n > 1:
            yield _with(layout, w // n, drop=(axis,) + AXIS_KNOBS[axis])            # the axis gone
            yield _with(layout, drop=(axis,) + AXIS_KNOBS[axis],                     # its ranks to DP
                        **({"global_batch_size": gbs * n} if gbs else {}))
            if n > 2:
                yield _with(layout, w // 2, **{axis: n // 2})
    if c.get("num_experts") is not None:
        yield _with(layout, drop=MOE)
    if gbs and gbs > c.get("micro_batch_size", 2) * dp:
        yield _with(layout, drop=("global_batch_size",))                             # one microbatch
    if c.get("micro_batch_size", 2) > 1:
        yield _with(layout, micro_batch_size=1, **({"global_batch_size": gbs // 2} if gbs else {}))
    for knob in KNOBS:
        if knob in c:
            yield _with(layout, drop=RECOMPUTE if knob == "recompute_granularity" else
                        ("num_query_groups", knob) if knob == "group_query_attention" else (knob,))
    if c.get("normalization") == "RMSNorm":
        yield _with(layout, drop=LLAMA)                                              # the GPT-2 family
    if c.get("params_dtype") == "float32":
        yield _with(layout, params_dtype="float64")
    n, pp = c.get("num_layers", 2), c.get("pipeline_model_parallel_size", 1)
    if n > pp and n > 1:
        v = c.get("num_layers_per_virtual_pipeline_stage")
        yield _with(layout, num_layers=n // 2, **({"num_layers_per_virtual_pipeline_stage": max(1, v // 2)} if v else {}))
    if c.get("seq_length", 64) > 8:
        yield _with(layout, seq_length=c["seq_length"] // 2)


def shrink(outcome, runner, max_runs: int = 24, log=None):
    """The smallest layout found that still fails like ``outcome`` (an Outcome of ``runner``);
    its ``shrink_runs`` attribute counts the runs it took."""
    from .space import refusal
    kind, best, runs = outcome.problems[0]["kind"], outcome, 0
    improved = True
    while improved and runs < max_runs:
        improved = False
        for cand in candidates(best.layout):
            if refusal(cand) is not None:
                continue
            runs += 1
            o = runner(cand)
            if log is not None:
                log(f"    shrink {runs}: {o.status} {(o.problems or [{}])[0].get('kind', '')}")
            if o.status == "finding" and o.problems[0]["kind"] == kind:
                best, improved = o, True
                break
            if runs >= max_runs:
                break
    best.shrink_runs = runs
    best.local_minimum = not improved
    return best

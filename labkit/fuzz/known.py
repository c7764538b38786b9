"""Findings the fuzzer has already made and that are not fixed yet: reported as "known", not new.

A fuzzer that stops at the same crash every time finds nothing else; so each finding, once
shrunk and filed, gets an entry here: its kind, a predicate over the layout that matches its shrunk
reproducer and what it generalizes to, and where it is tracked. ``tests/test_fuzz.py`` keeps each
one's reproducer as a strict xfail: the day it is fixed the test fails, and the entry goes.
"""
from __future__ import annotations

KNOWN = [
    {"name": "zero3_full_recompute", "kind": "crash",
     "what": "ZeRO-3 (labkit's per-layer unit) with full recomputation dies in iteration 2: a recomputed "
             "layer reads its parameters after they were freed (RuntimeError: the tensor's data is not "
             "allocated); found by labkit fuzz --seed 0 at its 4th layout",
     "reproducer": dict(world_size=2, zero_stage=3, num_layers=2, num_attention_heads=4, hidden_size=32,
                        seq_length=8, micro_batch_size=1, recompute_granularity="full", recompute_method="uniform",
                        recompute_num_layers=1, params_dtype="float64"),
     "when": lambda layout: (layout["implementation"] == "labkit"
                             and layout["config"].get("zero_stage") == 3
                             and layout["config"].get("recompute_granularity") == "full")},
    {"name": "moe_capacity_tp_sp", "kind": "grad",
     "what": "MoE with a capacity factor (token dropping) under TP + SP trains differently from one device: "
             "the first divergence is the MoE layer's forward on tp rank 1 (labkit routes and drops each TP "
             "rank's sequence shard; the reference drops over the whole microbatch) - to triage: labkit's "
             "capacity or the reference's; found by labkit fuzz --seed 100 --minutes 20 at its 21st layout",
     "reproducer": dict(world_size=2, tensor_model_parallel_size=2, sequence_parallel=True, num_attention_heads=4,
                        hidden_size=16, seq_length=8, num_layers=2, make_vocab_size_divisible_by=128, num_experts=4,
                        moe_router_topk=2, moe_expert_capacity_factor=1.5, micro_batch_size=1, params_dtype="float64"),
     "when": lambda layout: (layout["implementation"] == "labkit"
                             and layout["config"].get("num_experts") is not None
                             and layout["config"].get("moe_expert_capacity_factor") is not None
                             and layout["config"].get("tensor_model_parallel_size", 1) > 1)},
]


def known(layout: dict, kind: str) -> str | None:
    """The name of the known finding ``layout`` (failing with ``kind``) matches, or None."""
    for k in KNOWN:
        if k["kind"] == kind and k["when"](layout):
            return k["name"]
    return None

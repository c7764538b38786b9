"""Tier 2: an envelope measured for real (2 gloo ranks, 3 steps, bf16) and a planted bug judged by it.

Issue 32 items 3-4, the small version of ``python -m labkit.drift envelopes`` and tests/bench_drift.py:
the DP pair's measured drift sits inside the derived bound, the clean pair is within the envelope
made from it, and DP with gradients summed instead of averaged (``labkit.debug.BUGS``) is outside
from its first iteration.
"""
from __future__ import annotations

from labkit.drift.decide import decide, series_from_json
from labkit.drift.layouts import FAMILIES, MODEL, one_device
from labkit.drift.measure import differences, family_cell, run


def test_dp_bf16_envelope_inside_derived_and_a_planted_bug_outside():
    cache = {}
    cell = family_cell("DP", "bf16", [0], 3, cache, log=lambda s: None)
    assert cell["inside"] is True and cell["n"] == 8 and cell["u"] == 2.0 ** -8
    assert cell["band"]["grads_step1"] <= cell["derived"][0]
    env = {"cells": {"DP": {"bf16": cell}}}
    (one,) = cache.values()
    world, layout, _ = FAMILIES["DP"]
    bug = run(world, {**MODEL, **layout}, "bf16", 0, 3, bug="dp_grads_summed")
    d = differences(bug, one)
    assert d["grads_step1"] > 100 * cell["band"]["grads_step1"] + 1e-3   # far outside the clean pair's
    v = decide(series_from_json(bug), series_from_json(one), "DP", "bf16", env)
    assert not v.within and v.left_at == 1 and v.channel == "grad_norm"
    clean = run(world, {**MODEL, **layout}, "bf16", 0, 3)
    assert decide(series_from_json(clean), series_from_json(one), "DP", "bf16", env).within
    assert one_device({**MODEL, **layout}) == MODEL


def test_the_shard_boundary_bug_acts_wherever_a_shard_is_held():
    """The planted shard-boundary bug once zeroed only a member's ``shard.grad`` (fp32 ZeRO-1). Under
    bf16 the distributed optimizer reads ``main_grad``, and ZeRO-2/3 hold a shard per unit, so there
    it was a no-op: bench_drift scored it "missed" (its run equalled the clean run bit for bit) and
    the fuzzer rarely met a layout it acted on. Now each holder loses its boundary element: step 1's
    gradients differ from the clean run's, the losses from step 2 on."""
    from labkit.debug.bugs import BUGS
    bug = BUGS["dist_opt_shard_off_padded_vocab"]
    base = {**MODEL, **bug.layout, "global_batch_size": 8}          # 2 microbatches per rank
    zero3 = {k: v for k, v in base.items() if k != "use_distributed_optimizer"} | {"zero_stage": 3}
    for precision, kw in (("bf16", base), ("fp32", zero3)):
        planted = run(bug.world_size, kw, precision, 0, 2, bug=bug.name)
        clean = run(bug.world_size, kw, precision, 0, 2)
        d = differences(planted, clean)
        assert d["grads_step1"] > 1e-4, (precision, d)
        assert d["loss"][0] == 0 and d["loss"][1] > 0, (precision, d)

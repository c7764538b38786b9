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

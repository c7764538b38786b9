"""Tier 1: the lab's checks (labkit.check.debugging) pass a right answer and fail a wrong one.

Issue 22, lab "When training goes wrong". No ranks: the planted bug and the hang of a seed are
known without running them (their findings are proven by tests/test_debug_bugs.py and
tests/test_debug_hangs.py); the reshard is compared with index arithmetic, and a student who calls
labkit's own shard_plan.cut is refused.
"""
from __future__ import annotations

import torch

from labkit import shard_plan as sp
from labkit.check import debugging as check
from labkit.debug.bugs import assigned_bug


def test_planted_bug_answers():
    for seed in range(12):
        want = assigned_bug(seed).expect
        assert check.planted_bug({"layer": want["layer"], "collective": want["collective"]}, seed)
        assert not check.planted_bug({"layer": "decoder.layers.9", "collective": want["collective"]}, seed)
        wrong = "all_reduce on world" if want["collective"] != "all_reduce on world" else None
        assert not check.planted_bug({"layer": want["layer"], "collective": wrong}, seed)


def _right(shards, ffn):
    half, n, out = ffn // 2, ffn // 4, [{} for _ in range(4)]
    for key in shards[0]:
        gate = torch.cat([s[key][:half] for s in shards])
        up = torch.cat([s[key][half:] for s in shards])
        for r in range(4):
            out[r][key] = torch.cat([gate[r * n:(r + 1) * n], up[r * n:(r + 1) * n]])
    return out


def _contiguous(shards, ffn):
    """The classic mistake: cut the fused [gate; up] in 4 contiguous row blocks."""
    out = [{} for _ in range(4)]
    for key in shards[0]:
        dense = torch.cat([torch.cat([s[key][:ffn // 2] for s in shards]), torch.cat([s[key][ffn // 2:] for s in shards])])
        for r, piece in enumerate(dense.chunk(4)):
            out[r][key] = piece
    return out


def _uses_labkit(shards, ffn):
    return [{k: sp.cut(torch.zeros(2 * ffn, 4), sp.ParamShard("w", (2 * ffn, 4))) for k in shards[0]}] * 4


def test_reshard_check():
    assert check.reshard(_right)
    assert not check.reshard(_contiguous)
    result = check.reshard(_uses_labkit)
    assert not result and "disabled during this check" in result.message
    assert not check.reshard(lambda shards, ffn: shards)          # TP2 pieces returned as they are


def test_hang_diagnosis_check():
    for seed in range(12):
        scenario, culprit = check.hang_assignment(seed)
        waits = {culprit: "barrier", 1 - culprit: check.WAITS[scenario]}
        assert check.hang_diagnosis({"waits": waits, "culprit": culprit}, seed)
        assert not check.hang_diagnosis({"waits": waits, "culprit": 1 - culprit}, seed)
        assert not check.hang_diagnosis({"waits": {0: "barrier", 1: "barrier"}, "culprit": culprit}, seed)
    assert {check.hang_assignment(s) for s in range(40)} == set(check.HANGS)

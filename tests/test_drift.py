"""Tier 1 (no processes): labkit.drift's bounds, its decision on synthetic logs, its command line.

Issue 32 items 3-4. The unit roundoffs are checked against torch's own finfo (eps / 2), and the
summation bound against sums rounded in bf16/fp16 in two orders (an independent computation).
"""
from __future__ import annotations

import json
import math

import pytest
import torch

from labkit.drift.bounds import (PRECISIONS, derived_band, gamma, precision_kwargs, precision_name,
                                 probabilistic_band, reordered_terms, unit_roundoff)
from labkit.drift.decide import MARGIN, Series, decide, drift, series_from_log, threshold
from labkit.drift.layouts import FAMILIES, family_of, one_device, parse_layout


# -- bounds -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name, dtype", [("fp32", torch.float32), ("bf16", torch.bfloat16), ("fp16", torch.float16)])
def test_unit_roundoff_is_half_of_torch_eps(name, dtype):
    assert unit_roundoff(name) == torch.finfo(dtype).eps / 2


def test_gamma_and_band():
    u = 2.0 ** -8
    assert gamma(7, u) == pytest.approx(7 * u / (1 - 7 * u))
    assert gamma(256, u) == math.inf                        # n u >= 1: no bound
    band = derived_band(20, u, 8)
    assert band[0] == pytest.approx(2 * gamma(7, u)) and band[19] == pytest.approx(20 * band[0])
    assert derived_band(5, 2.0 ** -4, 17) is None           # E4M3 over 17 terms: 16 u = 1, none exists
    assert probabilistic_band(4, u, 8)[3] == pytest.approx(2 * math.sqrt(32) * u)
    assert reordered_terms(4, 2) == 8
    with pytest.raises(ValueError, match=">= 1"):
        reordered_terms(0, 2)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_two_summation_orders_differ_within_twice_gamma(dtype):
    """Sum n values rounding after every addition, forwards and in a shuffled order: the two
    results differ by at most 2 gamma_{n-1} sum|x| (Higham's bound, each order's error <= gamma_{n-1} sum|x|)."""
    g = torch.Generator().manual_seed(0)
    u = torch.finfo(dtype).eps / 2
    worst = 0.0
    for trial in range(200):
        n = int(torch.randint(2, 40, (1,), generator=g))
        x = (torch.randn(n, generator=g, dtype=torch.float64) * 10 ** torch.randn(1, generator=g)).to(dtype)
        s1, s2 = torch.zeros((), dtype=dtype), torch.zeros((), dtype=dtype)
        for v in x:
            s1 = s1 + v
        for v in x[torch.randperm(n, generator=g)]:
            s2 = s2 + v
        bound = 2 * gamma(n - 1, u) * float(x.double().abs().sum())
        assert abs(float(s1) - float(s2)) <= bound
        worst = max(worst, abs(float(s1) - float(s2)) / bound)
    assert worst > 0.01            # the orders do differ: the test can fail


def test_precision_is_passed_through():
    assert precision_kwargs("bf16") == {"bf16": True} and precision_kwargs({"fp8": {"fp8_format": "e4m3"}}) == {
        "fp8": {"fp8_format": "e4m3"}}
    assert precision_name({"fp16": True, "loss_scale": 8.0}) == "fp16" and precision_name({}) == "fp32"
    assert precision_name({"fp8": {"fp8_format": "hybrid", "fp8_recipe": "delayed"}}) == "fp8 hybrid delayed"
    assert unit_roundoff({"fp8": {"fp8_format": "e4m3"}}) == 2.0 ** -4
    with pytest.raises(ValueError, match="precision must be one of"):
        precision_kwargs("fp4")
    assert set(PRECISIONS) == {"fp32", "bf16", "fp16", "fp8 tensorwise", "fp8 delayed", "fp8 blockwise", "fp8 mxfp8"}


# -- layouts ------------------------------------------------------------------------------------------
def test_parse_layout_and_family():
    assert parse_layout("tp=2,sp") == (2, {"tensor_model_parallel_size": 2, "sequence_parallel": True})
    assert parse_layout("1") == (1, {}) and parse_layout("") == (1, {})
    assert parse_layout("dp=2,zero=1")[0] == 2
    cases = {"dp=2": "DP", "dp=2,zero=1": "ZeRO", "tp=2,sp": "TP+SP", "cp=2": "CP", "pp=2,vpp=2": "PP/VPP",
             "dp=2,ep=2": "EP", "dp=2,tp=2,sp": "composed", "1": "one device", "tp=2,pp=2": "composed"}
    for text, fam in cases.items():
        assert family_of(parse_layout(text), (1, {})) == fam, text
    assert family_of(parse_layout("tp=2"), parse_layout("dp=2")) == "composed"
    for world, layout, _ in FAMILIES.values():     # each family's own layout is in that family
        assert family_of((world, layout)) in FAMILIES
    assert [family_of((w, l)) for w, l, _ in FAMILIES.values()] == list(FAMILIES)
    assert one_device({"tensor_model_parallel_size": 2, "bf16": True, "num_layers": 4}) == {"bf16": True, "num_layers": 4}
    for bad in ("tp=0", "xp=2", "tp=two"):
        with pytest.raises(ValueError, match="layout part"):
            parse_layout(bad)


# -- the decision ---------------------------------------------------------------------------------
def _env(band_loss, band_gn, pairs=None):
    cell = {"band": {"loss": band_loss, "grad_norm": band_gn, "grads_step1": 0.0},
            "pairs": pairs or [{"loss": band_loss, "grad_norm": band_gn}]}
    return {"cells": {"DP": {"bf16": cell}}}


def _series(losses, norms=None):
    return Series(list(range(1, len(losses) + 1)), list(losses), list(norms or [None] * len(losses)))


def test_within_and_outside_with_the_step_it_left():
    env = _env([1e-4] * 5, [1e-3] * 5)
    base = [3.0, 2.9, 2.8, 2.7, 2.6]
    near = [b * (1 + 2e-4) for b in base]                   # 2x the band: within MARGIN x band
    v = decide(_series(near), _series(base), "DP", "bf16", env)
    assert v.within and v.left_at is None and 0.4 < v.worst < 0.6 and v.fraction == 0.0   # the clean pair: 1/4
    far = base[:2] + [b * (1 + 10 * 1e-4) for b in base[2:]]   # 10x the band from step 3
    v = decide(_series(far), _series(base), "DP", "bf16", env)
    assert not v.within and v.left_at == 3 and v.channel == "loss" and "iteration 3" in v.text()
    gn = decide(_series(base, [1.0, 2.0, 1, 1, 1]), _series(base, [1.0] * 5), "DP", "bf16", env)
    assert not gn.within and gn.left_at == 2 and gn.channel == "grad_norm"


def test_nan_on_one_side_is_outside_and_fraction_counts_clean_pairs():
    env = _env([1e-4] * 3, [1e-3] * 3)
    v = decide(_series([3.0, float("nan"), 2.0]), _series([3.0, 2.9, 2.8]), "DP", "bf16", env)
    assert not v.within and v.left_at == 2
    assert drift(float("nan"), float("nan")) == math.inf and drift(1.0, 0.0) == math.inf and drift(2.0, 2.0) == 0
    pairs = [{"loss": [x] * 3, "grad_norm": [0.0] * 3} for x in (1e-5, 5e-5, 1e-4)]
    env = _env([1e-4] * 3, [1e-3] * 3, pairs)
    v = decide(_series([1.0 + 6e-5] * 3), _series([1.0] * 3), "DP", "bf16", env)
    assert v.within and v.fraction == pytest.approx(1 / 3)


def test_threshold_extends_the_band_and_keeps_a_floor():
    assert threshold([1e-6, 2e-6], 1, 0.0) == MARGIN * 1e-6
    assert threshold([1e-6, 2e-6], 4, 0.0) == pytest.approx(MARGIN * 4e-6)
    assert threshold([0.0, 0.0], 2, 3e-7) == 3e-7


def test_megatron_logs_equal_to_print_precision_are_within_even_with_a_zero_band():
    """Two logs of the same numbers printed by Megatron's format differ by rounding only: within;
    a zero measured band (bf16 DP can be bitwise equal to one device) still leaves that floor."""
    from labkit.training import format_iteration
    env = _env([0.0] * 3, [0.0] * 3)
    losses = [3.1234564, 3.0000001, 2.9]
    log_a = "\n".join(format_iteration(i + 1, 3, 8, 1.0, 1e-3, 8, x, 1.2344, None) for i, x in enumerate(losses))
    log_b = "\n".join(format_iteration(i + 1, 3, 8, 1.0, 1e-3, 8, x * (1 + 1e-7), 1.2346, None)
                      for i, x in enumerate(losses))
    a, b = series_from_log(log_a), series_from_log(log_b)
    assert a.iterations == [1, 2, 3] and a.grad_norm[0] == pytest.approx(1.234)
    assert decide(a, b, "DP", "bf16", env).within
    log_c = "\n".join(format_iteration(i + 1, 3, 8, 1.0, 1e-3, 8, x * (1 + 1e-4 * i), 1.2344, None)
                      for i, x in enumerate(losses))
    v = decide(series_from_log(log_c), b, "DP", "bf16", env)
    assert not v.within and v.left_at == 2


def test_missing_envelope_names_what_was_measured():
    with pytest.raises(ValueError, match="no measured envelope for CP bf16; measured: DP bf16"):
        decide(_series([1.0]), _series([1.0]), "CP", "bf16", _env([0.0], [0.0]))


# -- the command line -------------------------------------------------------------------------------
def test_cli_exit_status_and_text(tmp_path, capsys):
    from labkit.__main__ import main
    env = tmp_path / "env.json"
    env.write_text(json.dumps(_env([1e-4] * 3, [1e-3] * 3)))
    a, b, c = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "c.json"
    a.write_text(json.dumps({"losses": [3.0, 2.9, 2.8], "grad_norms": [1.0, 1.0, 1.0]}))
    b.write_text(json.dumps([3.0, 2.9, 2.8 * (1 + 1e-4)]))
    c.write_text(json.dumps([3.0, 2.95, 2.8]))
    assert main(["drift", str(b), str(a), "--layout-a", "dp=2", "--envelopes", str(env)]) == 0
    assert "within the envelope of DP bf16" in capsys.readouterr().out
    assert main(["drift", str(c), str(a), "--layout-a", "dp=2", "--envelopes", str(env), "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["within"] is False and out["left_at"] == 2 and out["family"] == "DP"
    assert main(["drift", str(c), str(a), "--layout-a", "cp=2", "--envelopes", str(env)]) == 2
    assert "no measured envelope for CP bf16" in capsys.readouterr().err
    assert main(["drift", str(c), str(a), "--layout-a", "tp=x", "--envelopes", str(env)]) == 2


def test_envelope_figure_is_legible_on_a_phone():
    from labkit.figures import MIN_LABEL_PX, smallest_label_px, svg
    from labkit.figures.low_precision import envelopes
    cell = {"u": 2.0 ** -8, "n": 8, "band": {"loss": [0.0, 1e-6, 2e-6], "grad_norm": [1e-5] * 3},
            "derived": derived_band(3, 2.0 ** -8, 8), "probabilistic": probabilistic_band(3, 2.0 ** -8, 8)}
    table = {"cells": {f: {"bf16": cell, "fp32": dict(cell, u=2.0 ** -24)} for f in FAMILIES}}
    assert smallest_label_px(svg(envelopes(table, ("fp32", "bf16")))) >= MIN_LABEL_PX


def test_leave_one_out_counts_a_pair_beyond_the_others_band():
    """Three clean pairs: two drift 1e-6, the third 1e-5. Judged by the others' band at margin 4,
    the third is outside (10x > 4x) and the first two are within; at margin 20 none is."""
    from labkit.drift.decide import leave_one_out

    def pair(d):
        return {"loss": [d, d], "grad_norm": [d, d], "grads_step1": d}
    env = {"cells": {"DP": {"bf16": {"pairs": [pair(1e-6), pair(1e-6), pair(1e-5)]}},
                     "CP": {"bf16": {"pairs": [pair(1e-6)]}}}}        # one pair: nothing to leave out
    assert leave_one_out(env, "bf16", 4.0) == (1, 3)
    assert leave_one_out(env, "bf16", 20.0) == (0, 3)

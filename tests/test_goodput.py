"""Tier 1: the goodput calculator (labkit.calc.goodput): Young/Daly, goodput, checkpoint bytes.

Issue 22. Pure Python. The optimum of the goodput model sits at Daly's interval; asynchronous
saving raises the best goodput; the bytes of a checkpoint agree with what BigScience published
for BLOOM (2.3 TB with optimizer states, 176B parameters); bad input is refused by name.
"""
from __future__ import annotations

import math

import pytest

from labkit import calc
from labkit.calc import goodput as gp

DAY = 86400.0


def test_young_and_daly():
    assert gp.young_interval(60, DAY) == pytest.approx(math.sqrt(2 * 60 * DAY))
    # delta << M: Daly's correction is small and positive before subtracting delta
    d, m = 10.0, 10 * DAY
    assert gp.daly_interval(d, m) == pytest.approx(gp.young_interval(d, m) - d, rel=2e-3)
    assert gp.daly_interval(3 * DAY, DAY) == DAY            # delta >= 2M: checkpoint every M


def test_goodput_is_best_near_dalys_interval():
    for save, mtbf, restart in [(60, DAY, 600), (300, 8 * 3600, 900), (2, 3 * 3600, 300)]:
        taus = [save * 1.02 ** k for k in range(1, 800)]
        best = max(gp.goodput(t, save, mtbf, restart) for t in taus)
        at_daly = gp.goodput(gp.daly_interval(save, mtbf), save, mtbf, restart)
        assert at_daly >= 0.999 * best
        assert gp.goodput(gp.daly_interval(save, mtbf) / 8, save, mtbf, restart) < 0.99 * best


def test_async_saving_buys_goodput():
    sync = gp.best_goodput(save_seconds=240, mtbf_seconds=3 * DAY, restart_seconds=900)
    asyn = gp.best_goodput(save_seconds=3, mtbf_seconds=3 * DAY, restart_seconds=900, write_lag_seconds=240)
    assert asyn["interval"] < sync["interval"] and asyn["goodput"] > sync["goodput"]


def test_checkpoint_bytes_match_blooms_published_size():
    """BLOOM-176B (BigScience 2022, arXiv:2211.05100): 70 layers, h 14336, 112 heads, vocab 250880;
    its full checkpoint with optimizer states is 2.3 TB (bigscience.notion.site, BigScience 176B
    Model): 14 B per parameter (bf16 weights, fp32 master weights and two moments) gives 2.47e12."""
    bloom = calc.ModelConfig(70, 14336, 112, seq_length=2048, vocab_size=250880, make_vocab_size_divisible_by=128,
                             position_embedding_type="none")
    par = calc.ParallelConfig(world_size=384, tensor_model_parallel_size=4, pipeline_model_parallel_size=12,
                              global_batch_size=2048, use_distributed_optimizer=True)
    out = gp.checkpoint_bytes(bloom, par)
    assert out["per_param"] == 14
    assert 2.3e12 * 0.95 < out["total"] < 2.3e12 * 1.1
    assert out["writers"] == 384 and out["max_rank"] < 1.5 * out["total"] / 384
    plain = gp.checkpoint_bytes(bloom, par.with_(use_distributed_optimizer=False))
    assert plain["writers"] == 48 and plain["max_rank"] > 7 * out["max_rank"]


def test_save_seconds_and_refusals():
    assert gp.save_seconds(1e9, 2e9) == 0.5
    assert gp.save_seconds(1e9, 2e9, total_bytes=1e12, filesystem_bandwidth=1e11) == 10.0
    with pytest.raises(ValueError, match="mtbf_seconds must be a finite number > 0"):
        gp.young_interval(60, 0)
    with pytest.raises(ValueError, match="save_seconds must be a finite number >= 0"):
        gp.goodput(100, -1, DAY)
    with pytest.raises(ValueError, match="interval must be"):
        gp.goodput(float("nan"), 1, DAY)

"""Exact resume for every data-parallel implementation labkit.train runs, mixed precision included.

Issue 22 (with issue 21's memory knobs). tests/test_checkpoint.py resumes TP2 + SP x DP2 under the
distributed optimizer (ZeRO-1); here the other holders of the optimizer state, each saved at
iteration 2 and resumed on the same 2 ranks to iteration 4, must give the losses, gradient norms,
loss scales and skipped iterations of the run that never stopped, bit for bit:

    ZeRO-2 bucketed, ZeRO-3 per layer (fsdp.py: a flat shard per unit), float64, dropout on
    bf16, distributed optimizer, dropout on: fp32 master shards + moments (the 16-bit weights are
        loaded from the masters, rounded as the step rounds them; main_grad is transient): 12 B
        per parameter written once (Megatron's torch_dist also writes the 16-bit weights: 14 B)
    fp16 with Megatron's dynamic loss scale, moved by the save: iterations 1-2 overflow at 2^17
        (skipped, hysteresis 2 spent, scale 2^16), so a run that restarted the scaler at 2^17
        with hysteresis 2 would skip iteration 3 and grow the scale at another iteration

and a bf16 checkpoint of the distributed optimizer (masters in shards) loads under plain DP (each
rank the whole masters) and continues as the plain run that never stopped: with 2 ranks the two
layouts' sums are the same additions, so their uninterrupted runs are equal too (asserted).
"""
from __future__ import annotations

import math

import pytest

import labkit

MODEL = dict(num_layers=2, hidden_size=32, num_attention_heads=4, seq_length=16, micro_batch_size=2,
             global_batch_size=8, make_vocab_size_divisible_by=64)
DROPOUT = dict(hidden_dropout=0.1, attention_dropout=0.1)
CASES = {
    "zero2 bucketed": dict(MODEL, params_dtype="float64", zero_stage=2, **DROPOUT),
    "zero3 per layer": dict(MODEL, params_dtype="float64", zero_stage=3, **DROPOUT),
    "bf16 distributed optimizer": dict(MODEL, bf16=True, use_distributed_optimizer=True, **DROPOUT),
    "fp16 dynamic loss scale": dict(MODEL, fp16=True, initial_loss_scale=2.0 ** 17, hysteresis=2,
                                    loss_scale_window=2),
}


def _same(a: list[float], b: list[float]) -> bool:
    """Equal bit for bit, a skipped iteration's NaN grad norm equal to NaN."""
    return len(a) == len(b) and all(x == y or (math.isnan(x) and math.isnan(y)) for x, y in zip(a, b))


def _resumed(tmp_path, kw, load_kw=None):
    """(run to 4 that never stopped, run saved at 2, run loaded at 2 to 4 with ``load_kw``)."""
    load_kw = kw if load_kw is None else load_kw
    whole = labkit.train(world_size=2, steps=4, log_interval=0, **load_kw)
    first = labkit.train(world_size=2, steps=2, log_interval=0, save=tmp_path, **kw)
    rest = labkit.train(world_size=2, steps=4, log_interval=0, load=tmp_path, **load_kw)
    assert rest.ranks[0]["start"] == 2 and len(rest.losses) == 2
    return whole, first, rest


@pytest.mark.parametrize("name", list(CASES))
def test_resume_on_the_same_layout_is_bit_exact(tmp_path, name):
    kw = CASES[name]
    whole, first, rest = _resumed(tmp_path, kw)
    assert first.losses == whole.losses[:2] and first.loss_scales == whole.loss_scales[:2]
    assert rest.losses == whole.losses[2:], f"{name}: losses after the resume differ (bit for bit)"
    assert _same(rest.grad_norms, whole.grad_norms[2:]), name
    assert rest.loss_scales == whole.loss_scales[2:] and rest.skipped == whole.skipped[2:], name
    if "bf16" in name:       # written once: fp32 masters + two fp32 moments, 12 B per parameter
        params = sum(p.numel() for p in labkit.model.GPT(first.config.model_config()).parameters())
        assert sum(r["checkpoint"][0]["bytes"] for r in first.ranks) == 12 * params
    if "fp16" in name:       # the scaler's state at the save is not the one a fresh run starts with
        assert whole.skipped == [True, True, False, False], whole.skipped
        assert whole.loss_scales[1] == 2.0 ** 16 != kw["initial_loss_scale"]


def test_bf16_distributed_optimizer_checkpoint_loads_under_plain_dp(tmp_path):
    sharded = CASES["bf16 distributed optimizer"]
    plain = dict(MODEL, bf16=True, **DROPOUT)
    whole, _, rest = _resumed(tmp_path, sharded, plain)
    other = labkit.train(world_size=2, steps=4, log_interval=0, **sharded)
    assert other.losses == whole.losses, "the two layouts differ without a checkpoint: the pair proves nothing"
    assert rest.losses == whole.losses[2:] and rest.grad_norms == whole.grad_norms[2:]

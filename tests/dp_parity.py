"""Shared by tests/test_data_parallel.py and tests/test_zero.py: the single-device reference and
one launch per DP size that trains several variants (labkit/measure/dp.py, the real Engine path).

Reference: ``labkit.reference.train_reference`` (an independent loop: whole global batch, one
forward/backward, plain AdamW), run for k = 0..5 steps to get the parameters after each step, plus
one extra forward/backward per step for the gradient norm. A missing 1/dp barely moves AdamW's
parameters (Adam is invariant to the gradient's scale), so the grad norm is compared too.
"""
from __future__ import annotations

import functools

import torch

from labkit import data
from labkit.reference import train_reference

STEPS, SEED, GBS = 5, 0, 8
MODEL = dict(num_layers=2, hidden_size=32, num_attention_heads=4, seq_length=32)
# fp32: parity differs only by the order of additions (microbatch sums, all-reduce); measured
# max |diff| of parameters <= 8.1e-7 over every variant and DP size, losses <= 5e-7.
FP32 = dict(rtol=1e-5, atol=5e-6)


@functools.lru_cache(maxsize=1)  # both test files use it in one session: compute once
def reference():
    """{"params": [state after step k], "losses": [...], "grad_norms": [...]} on one device."""
    params, norms = [], []
    tokens = data.load_tokens()
    for k in range(STEPS + 1):
        out = train_reference(steps=k, seed=SEED, return_model=True, micro_batch_size=GBS,
                              global_batch_size=GBS, **MODEL)
        losses, model = out["losses"], out["model"]
        if k:
            params.append({n: p.detach().clone() for n, p in model.named_parameters()})
        if k < STEPS:  # gradient of step k+1, taken at the parameters after k steps
            x, y = data.get_batch(tokens, k, GBS, MODEL["seq_length"], SEED)
            model.zero_grad()
            model.loss(x, y).backward()
            norms.append(float(torch.sqrt(sum(p.grad.double().pow(2).sum() for p in model.parameters()))))
    return {"params": params, "losses": losses, "grad_norms": norms}


def variants(names, dp: int) -> dict:
    """Each variant without accumulation (1 microbatch) and with it (2 microbatches)."""
    from labkit.measure.dp import VARIANTS
    out = {}
    for name in names:
        out[f"{name}"] = dict(VARIANTS[name], micro_batch_size=GBS // dp)
        out[f"{name}+accum"] = dict(VARIANTS[name], micro_batch_size=GBS // dp // 2)
    return out


def run(names, dp: int) -> list[dict]:
    import labkit
    from labkit.measure.dp import parity_worker
    return labkit.launch(parity_worker, dp, variants(names, dp), STEPS, SEED,
                         dict(MODEL, global_batch_size=GBS))


def check_parity(results: list[dict], ref: dict, name: str) -> float:
    """assert_close of params after every step, losses and grad norms; returns the max |diff|."""
    out = results[0][name]
    worst = 0.0
    for k in range(STEPS):
        for pname, expected in ref["params"][k].items():
            got = out["params"][k][pname]
            torch.testing.assert_close(got, expected, **FP32, msg=lambda m: f"{name} step {k + 1} {pname}: {m}")
            worst = max(worst, float((got - expected).abs().max()))
    torch.testing.assert_close(torch.tensor(out["losses"]), torch.tensor(ref["losses"]), rtol=1e-5, atol=2e-6)
    torch.testing.assert_close(torch.tensor(out["grad_norms"]), torch.tensor(ref["grad_norms"]),
                               rtol=1e-4, atol=1e-6, check_dtype=False)
    for r, res in enumerate(results):  # every replica holds rank 0's parameters, exactly
        assert res[name]["replica_max_diff"] == 0.0, f"{name}: rank {r} differs from rank 0"
    return worst

"""The oracle: a layout trains like one device (float64 reference) and moves the bytes calc predicts.

Chapter "Finding the bug nobody chose". A run of ``labkit.train`` and the single-device loop
``labkit.reference.train_reference`` on the same model and data differ, when both are right, only
in the ORDER of their floating-point additions (a TP all-reduce adds partial dot products that the
reference adds in one GEMM; gradient accumulation adds microbatches that the reference adds in one
batch; a ring all-reduce adds ranks in ring order). The bound below is the classical one for that.

**The derivation.** Let u be the unit roundoff of the run's dtype (2^-53 for float64, 2^-24 for
float32). A sum of N terms computed in any order satisfies (Higham, *Accuracy and Stability of
Numerical Algorithms*, 2nd ed., eq. 3.5 and section 4.2)

    |fl(sum x_i) - sum x_i|  <=  gamma_N * sum |x_i|,     gamma_N = N u / (1 - N u),

so two orders differ by at most 2 gamma_N sum |x_i|. N is the longest reduction on any value's
path: N = max(B s, h, ffn, V) (the B s tokens of the global batch summed into a weight's gradient;
h, the FFN width or the vocabulary V summed in a dot product). Bounding sum |x_i| <= N max |x_i|
and each summand by the largest gradient entry of the model, G = max |g_ref| (the assumption:
no reduction cancels below its own summands' scale by more than N), and composing the D = 2L + 2
reductions of a forward-backward chain (embedding, attention and MLP of each of L layers, output
and loss), each adding its own error to first order:

    |g_run - g_ref|  <=  2 D gamma_N N G                     (every gradient entry, after step 1)
    |L1_run - L1_ref| <=  2 D gamma_N N |L1_ref|             (the first loss: a forward only)

A later loss k also carries the parameters' drift: AdamW's first step moves a parameter by
lr g / (|g| + eps), whose derivative in g is at most lr / eps, so a gradient error e moves a
parameter by at most lr e / eps and the loss by at most ||g_ref||_1 lr e / eps per step:

    |Lk_run - Lk_ref| <=  2 D gamma_N N |Lk_ref| + (k - 1) ||g_ref||_1 (lr / eps) 2 D gamma_N N G.

Nothing here is tuned to pass: the bound is computed from the shape, the dtype and the optimizer.
For the fuzzer's float64 shapes (N <= 512, D <= 10) the gradient bound is about 1e-10 G, five
orders of magnitude below the smallest planted bug's error. Layouts with dropout are judged only
for running and finiteness: the reference draws other masks (labkit's RNG streams are Megatron's).

**The bytes.** ``labkit.calc.composed.labkit_step_bytes`` predicts every byte a rank sends per
step for TP, SP, PP, VPP, DP and ZeRO-1 on the GPT-2 family; where it applies (:func:`predicts`),
each rank's counters over the run, divided by the steps, must equal it exactly.
"""
from __future__ import annotations

import math

UNIT_ROUNDOFF = {"float64": 2.0 ** -53, "float32": 2.0 ** -24}


def bound(cfg, steps: int = 1) -> dict:
    """The derived bounds for ``cfg`` (a TrainConfig): {"N", "D", "gamma", "grad_rel", "loss_rel",
    "adam_gain"}; see the module docstring."""
    mc = cfg.model_config()
    u = UNIT_ROUNDOFF[cfg.params_dtype]
    gbs = cfg.global_batch_size or cfg.micro_batch_size   # the reference's batch: set explicitly by run.py
    ffn = max(mc.ffn_hidden_size or 4 * cfg.hidden_size, cfg.moe_ffn_hidden_size or 0)
    n = max(gbs * cfg.seq_length, cfg.hidden_size, ffn, mc.vocab_size)
    d = 2 * cfg.num_layers + 2
    gamma = n * u / (1 - n * u)
    rel = 2 * d * gamma * n
    return {"N": n, "D": d, "gamma": gamma, "grad_rel": rel, "loss_rel": rel, "adam_gain": cfg.lr / cfg.adam_eps}


def _finite(xs) -> bool:
    return all(math.isfinite(x) for x in xs)


def compare(run, ref: dict, cfg, dropout: bool = False) -> list[dict]:
    """Problems of ``run`` (a TrainResult with grads) against ``ref`` (train_reference's dict with
    grads): [{"kind", "what", "error", "bound"}], empty when it trains like one device.
    Finiteness is checked first: a NaN fails every comparison (``abs(nan) > b`` is False)."""
    import torch
    out = []
    if not _finite(run.losses) or not _finite(run.grad_norms):
        return [{"kind": "nonfinite", "what": "losses", "error": float("nan"), "bound": 0.0}]
    if len(run.losses) != len(ref["losses"]):
        return [{"kind": "loss", "what": "number of iterations", "error": len(run.losses), "bound": len(ref["losses"])}]
    if dropout:
        return out
    b = bound(cfg)
    grads = {k: v.double() for k, v in (run.grads or {}).items()}
    if set(grads) != set(ref["grads"]):
        out.append({"kind": "grad", "what": f"parameter names differ: {sorted(set(grads) ^ set(ref['grads']))[:4]}",
                    "error": float("inf"), "bound": 0.0})
        return out
    g_max = max(float(g.abs().max()) for g in ref["grads"].values())
    g_l1 = sum(float(g.abs().sum()) for g in ref["grads"].values())
    tol_g = b["grad_rel"] * g_max
    for name, g in ref["grads"].items():
        d = grads[name] - g.double()
        if not bool(torch.isfinite(d).all()):
            out.append({"kind": "nonfinite", "what": f"gradient of {name}", "error": float("nan"), "bound": tol_g})
            continue
        err = float(d.abs().max()) if d.numel() else 0.0
        if err > tol_g:
            out.append({"kind": "grad", "what": f"gradient of {name}", "error": err, "bound": tol_g})
    for k, (x, y) in enumerate(zip(run.losses, ref["losses"])):
        tol = b["loss_rel"] * abs(y) + k * g_l1 * b["adam_gain"] * tol_g
        if abs(x - y) > tol:
            out.append({"kind": "loss", "what": f"loss of iteration {k + 1}", "error": abs(x - y), "bound": tol})
    return out


def predicts(cfg, implementation: str = "labkit") -> bool:
    """Whether ``labkit_step_bytes`` covers this layout: labkit's own implementation, the GPT-2
    family, no CP / EP / MoE, ZeRO <= 1, no recompute (a recomputed forward repeats its collectives)."""
    return (implementation == "labkit" and cfg.context_parallel_size == 1 and cfg.num_experts is None
            and cfg.effective_zero_stage <= 1 and cfg.recompute_granularity is None
            and cfg.normalization == "LayerNorm" and not cfg.swiglu and cfg.add_bias_linear
            and cfg.position_embedding_type == "learned_absolute" and not cfg.group_query_attention
            and cfg.untie_embeddings_and_output_weights is False and cfg.ddp_bucket_size is None)


def compare_bytes(run, cfg, steps: int) -> list[dict]:
    """Each rank's counted bytes per step against ``labkit_step_bytes`` (only where :func:`predicts`)."""
    from ..calc.composed import labkit_step_bytes
    model, par = cfg.megatron_view(run.world_size)
    e = 8 if cfg.params_dtype == "float64" else 4
    out = []
    for r, rank in enumerate(run.ranks):
        want = labkit_step_bytes(model, par, rank["coords"]["pp"], bytes_per_element=e)
        got = {g: {op: v["bytes"] / steps for op, v in ops.items()} for g, ops in rank["comm"].items()
               if ops and g in ("tp", "pp", "dp", "embd")}
        if got != want:
            diff = {g: (got.get(g), want.get(g)) for g in set(got) | set(want) if got.get(g) != want.get(g)}
            out.append({"kind": "bytes", "what": f"rank {r} {rank['coords']}: counted vs calc {diff}",
                        "error": 1.0, "bound": 0.0})
            break
    return out

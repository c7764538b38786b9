"""Memory per GPU: weights, gradients, optimizer states and activations, for every pipeline stage.

Chapter "Why parallelism: memory and compute". This is labkit's own, fuller model; Megatron-LM's
own estimate is reproduced exactly in ``megatron.py`` and the chapter explains the differences:
here activations are divided by CP, optimizer states (and with ZeRO-2/3 gradients and
parameters) are sharded over DP*CP, expert parameters over EP x ETP and their ZeRO shards over the
expert-data-parallel ranks world / (ETP x EP x PP), as Megatron's storage classes, every stage is computed (the first
holds the most in-flight microbatches, first/last hold the embeddings), and recompute may be
none, selective or full.

Attention is one explicit assumption, ``attention=``, applied to every layout alike (never chosen
by the layout): "flash" (the default) is a fused kernel that keeps only the output and the
log-sum-exp, as Megatron-Core runs by default (``--attention-backend auto``: Transformer Engine's
flash or fused kernels); "math" materializes the s x s scores (softmax, its dropout output and
mask), as labkit's own dense attention and Megatron's ``--attention-backend unfused`` do.
Comparing layouts under different assumptions would credit one axis with what the kernel saved:
at 32K tokens GPT-2 XL needs 39.8 GiB per H100 on 8-way DP with flash attention and full
recompute, 164.7 GiB with math (tests/test_calc_attention.py).
"""
from __future__ import annotations

import math

from ..validate import positive_int
from .config import (MIXED_18, ModelConfig, ParallelConfig, PrecisionConfig, num_microbatches,
                     virtual_pipeline_size)
from .comm import _check_sizes
from .params import holds_ends, stage_params

ATTENTION = ("flash", "math")   # fused kernel (output + log-sum-exp) | materialized s x s scores


def check_attention(attention) -> str:
    """``attention`` itself, or a ValueError naming the two kernels the memory model knows."""
    if attention not in ATTENTION:
        raise ValueError(f"attention must be one of {ATTENTION} (fused kernel, or materialized "
                         f"s x s scores), got {attention!r}")
    return attention


def zero_memory_per_rank(num_params, dp, zero_stage, bytes_param=4, bytes_grad=4, bytes_optim=8) -> dict:
    """Bytes of {"params", "grads", "optimizer"} on one rank under ZeRO stage 0-3 over dp ranks.

    Rajbhandari et al. 2020 (ZeRO), Fig. 1: stage 1 shards optimizer states, stage 2 also the
    gradients, stage 3 also the parameters. Padding rule: the flat buffer is padded to a multiple
    of dp so that all shards are equal, so a sharded quantity takes ceil(num_params/dp) elements.
    Defaults are the labs' fp32 AdamW (4 + 4 + 8 B); mixed precision is 2, 2 (or 4), 12.
    """
    if zero_stage not in (0, 1, 2, 3):
        raise ValueError(f"zero_stage must be 0, 1, 2 or 3, got {zero_stage!r}")
    positive_int("dp", dp)
    _check_sizes(num_params=num_params, bytes_param=bytes_param, bytes_grad=bytes_grad, bytes_optim=bytes_optim)
    shard = math.ceil(num_params / dp)
    return {"params": (shard if zero_stage >= 3 else num_params) * bytes_param,
            "grads": (shard if zero_stage >= 2 else num_params) * bytes_grad,
            "optimizer": (shard if zero_stage >= 1 else num_params) * bytes_optim}


def activation_bytes_per_layer(seq_length, micro_batch_size, hidden_size, num_attention_heads, tp=1,
                               sequence_parallel=False, recompute=None) -> float:
    """Activation bytes one transformer layer keeps for the backward, 16-bit, on one TP rank.

    Korthikanti et al. 2022, Table 2 (s, b, h, a, t; dropout masks 1 byte, ffn = 4h):
      no parallelism      s*b*h*(34 + 5*a*s/h)
      TP                  s*b*h*(10 + 24/t + 5*a*s/(h*t))
      TP + SP             s*b*h*(34/t + 5*a*s/(h*t))
      selective recompute drops the 5*a*s/h attention term; full recompute keeps only the
      layer input, 2*s*b*h (divided by t with SP).
    """
    _check_sizes(seq_length=seq_length, micro_batch_size=micro_batch_size, hidden_size=hidden_size,
                 num_attention_heads=num_attention_heads)
    positive_int("tp", tp)
    s, b, h, a, t = seq_length, micro_batch_size, hidden_size, num_attention_heads, tp
    if recompute not in (None, "selective", "full"):
        raise ValueError(f"recompute must be None, 'selective' or 'full', got {recompute!r}")
    sp = sequence_parallel and t > 1
    if recompute == "full":
        return 2.0 * s * b * h / (t if sp else 1)
    attn = 0.0 if recompute == "selective" else 5.0 * a * s / (h * t)
    linear = 34.0 / t if sp else 10.0 + 24.0 / t
    return s * b * h * (linear + attn)


def layer_activation_bytes(model: ModelConfig, par: ParallelConfig, bytes_act=2, dropout=True,
                           attention="flash") -> float:
    """Korthikanti's count generalised: any element size, GQA, SwiGLU, optional dropout, CP.

    Per token (s*b tokens, s/cp with CP) a layer saves, in elements: the inputs of both norms and
    of linear_qkv and linear_fc1 (4h, replicated across TP unless SP), Q, K, V and the input of
    linear_proj (2q + 2kv), the activation input (f, or 2f with SwiGLU) and the input of
    linear_fc2 (f); plus two 1-byte dropout masks (h each). Attention ("math") saves the softmax
    output, the dropout output and mask: a*s per token each; "flash" saves only the output (q)
    and the log-sum-exp (a fp32 values). With ffn = 4h, 16-bit and dropout this is exactly
    ``activation_bytes_per_layer`` with ``attention="math"``.
    """
    check_attention(attention)
    s, b = model.seq_length / par.cp, par.micro_batch_size
    h, a, f, t = model.hidden_size, model.num_attention_heads, model.ffn_hidden_size, par.tp
    q, kv = model.kv_channels * a, model.kv_channels * model.query_groups
    sp = par.sequence_parallel and t > 1
    rec = par.recompute_granularity
    if rec == "full":
        return s * b * h * bytes_act / (t if sp else 1)
    mask = 1 if dropout else 0
    replicated = 4 * h * bytes_act + 2 * h * mask
    sharded = (2 * q + 2 * kv + (2 * f if model.swiglu else f) + f) * bytes_act
    if rec == "selective":
        attn = 0.0
    elif attention == "flash":
        attn = q * bytes_act + a * 4
    else:  # softmax output, dropout output and its mask: a*s_k each, s_k = full sequence
        attn = a * model.seq_length * (bytes_act * (2 if dropout else 1) + mask)
    per_token = (replicated / t if sp else replicated) + (sharded + attn) / t
    return s * b * per_token


def cp_layer_activation_bytes(model: ModelConfig, par: ParallelConfig, cp_comm_type="p2p", bytes_act=2,
                              dropout=True) -> float:
    """Activation bytes one layer keeps on one rank under labkit's context parallelism (chapter
    "Context parallelism"): ``layer_activation_bytes`` on s/c tokens with the attention term of the
    kernel each comm type runs. The ring ("p2p") and "all_gather" attend block by block and keep,
    like a flash kernel, only the output and the log-sum-exp ("flash": never the s/c x s scores);
    "a2a" (and CP 1) run labkit's dense attention over the full sequence for a/c heads, whose
    softmax is a*s per local token ("math"). This is what labkit's runtime saves, for comparing
    with its measurements; to compare layouts use ``memory_per_stage`` with one ``attention`` for
    all of them (Megatron runs fused, flash, kernels in every case)."""
    attention = "math" if par.cp == 1 or cp_comm_type == "a2a" else "flash"
    return layer_activation_bytes(model, par, bytes_act, dropout, attention)


GPIPE_ORDER = ("gpipe", "gpipe_v")   # labkit's schedules running every forward before any backward


def in_flight_microbatches(model: ModelConfig, par: ParallelConfig, stage: int) -> float:
    """Microbatches (in units of a full stage's layers) whose activations a stage holds at peak.

    1F1B: stage i runs pp - i warm-up forwards before its first backward, so holds min(pp-i, m).
    Interleaved (Megatron's schedule): rank i runs (pp-i-1)*2 + (v-1)*pp warm-up chunk-forwards
    plus one, each of 1/v of its layers; for stage 0 this is pp*(1 + (pp-1)/(pp*v)), the
    "interleaved memory penalty" of Megatron's estimate. GPipe's order (``GPIPE_ORDER``, on the
    loop or the V): every rank holds all m.
    """
    m, pp, v = num_microbatches(model, par), par.pp, virtual_pipeline_size(model, par)
    if par.pipeline_schedule in GPIPE_ORDER:
        return float(m)
    if v == 1:
        return float(min(pp - stage, m))
    chunks = min((pp - stage - 1) * 2 + (v - 1) * pp + 1, m * v)
    return chunks / v


def memory_per_stage(model: ModelConfig, par: ParallelConfig, precision: PrecisionConfig = MIXED_18,
                     dropout=True, attention="flash") -> list:
    """Bytes on one GPU of each pipeline stage: params, grads, optimizer, activations, total.

    ZeRO stage (``zero_stage``, or 1 for ``use_distributed_optimizer``) shards over DP*CP for
    dense parameters and over the expert-data-parallel size world / (ETP*EP*PP) for the routed
    experts (the ranks holding the same expert shard; Megatron's expert RankGenerator).
    Activations: in-flight microbatches x layers on the stage x ``layer_activation_bytes``; the
    first stage adds the embedding dropout mask, the last the final norm's input and output and
    the fp32 log-softmax of the logits (the cross-entropy), for one microbatch: with 16-bit
    activations 4sbh + 4sbV, as in Megatron's estimate. ``attention``: "flash" (default, Megatron-
    Core's fused kernels) or "math" (materialized scores), the same for every stage and layout.
    """
    from .config import validate
    check_attention(attention)
    validate(model, par)
    stage_zero = par.optimizer_shard_stage
    dp_cp = par.dp * par.cp
    # "optimizer": fp32 masters and moments, and the fp32 gradient copy Megatron's fp16 optimizer
    # keeps (``precision.sharded_bytes``: 12, or 16 for MEGATRON_FP16), sharded alike
    bp, bg, bo = precision.bytes_param, precision.bytes_grad, precision.sharded_bytes
    out = []
    for stage in range(par.pp):
        c = stage_params(model, par, stage)
        d = zero_memory_per_rank(c["dense"], dp_cp, stage_zero, bp, bg, bo)
        e = zero_memory_per_rank(c["expert"], par.edp, stage_zero, bp, bg, bo)
        layers = model.num_layers // par.pp
        act = layers * layer_activation_bytes(model, par, precision.bytes_activation, dropout,
                                              attention) * in_flight_microbatches(model, par, stage)
        sb = model.seq_length / par.cp * par.micro_batch_size
        first, last = holds_ends(model, par, stage)
        if first and dropout:  # the embedding dropout's 1-byte mask, per in-flight microbatch
            act += sb * model.hidden_size * in_flight_microbatches(model, par, 0)
        if last:  # final norm input and output; fp32 log-softmax of the logits
            vocab = model.padded_vocab_size(par.tp) / par.tp
            act += sb * (2 * model.hidden_size * precision.bytes_activation + 4 * vocab)
        if par.recompute_granularity == "full":  # one layer is recomputed at a time, in full
            act += layer_activation_bytes(model, par.with_(recompute_granularity=None),
                                          precision.bytes_activation, dropout, attention)
        row = {"stage": stage, "params": d["params"] + e["params"], "grads": d["grads"] + e["grads"],
               "optimizer": d["optimizer"] + e["optimizer"], "activations": act,
               "num_params": c["dense"] + c["expert"]}
        row["total"] = row["params"] + row["grads"] + row["optimizer"] + row["activations"]
        out.append(row)
    return out


def peak_memory(model, par, precision=MIXED_18, **kw) -> float:
    """The largest per-GPU total over all pipeline stages (``attention="flash"`` unless given)."""
    return max(r["total"] for r in memory_per_stage(model, par, precision, **kw))

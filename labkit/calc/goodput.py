"""Goodput: how often to checkpoint, what a checkpoint weighs per rank, what async saving buys.

Chapter "When training goes wrong", section "Goodput". A job that fails every M seconds on average
(its mean time between failures, MTBF) and pays delta seconds of blocked training per checkpoint
loses, per failure, the work since the last checkpoint plus the restart. Young (1974,
doi:10.1145/361147.361115) gives the interval between checkpoints that minimizes the waste to first
order, tau = sqrt(2 delta M); Daly (2006, doi:10.1016/j.future.2004.11.016) the higher-order one,
tau = sqrt(2 delta M) (1 + sqrt(delta / 2M) / 3 + delta / 18M) - delta for delta < 2M, else M.

:func:`goodput` is the fraction of wall time that ends up as kept training (first order, failures
independent of the schedule): each interval of tau seconds of training pays ``save_seconds`` of
blocking, and each failure loses the restart, half an interval on average, and, with asynchronous
saving, the ``write_seconds`` during which the newest checkpoint is not yet on disk:

    goodput = tau / (tau + delta_block) * (1 - (restart + (tau + delta_block) / 2 + write_lag) / M)

Asynchronous saving (``labkit.train(async_save=True)``; Megatron's --async-save) blocks only for
the copy to host memory, so delta_block shrinks from the whole write to the staging copy, and the
best interval with it. :func:`checkpoint_bytes` counts what a layout writes, each value once
(labkit.checkpoint's rule): per parameter, the weights and the optimizer's states
(``precision.bytes_param + precision.bytes_optim``: 2 + 12 = 14 B in Megatron's mixed precision,
whose full checkpoint keeps bf16 weights and fp32 master weights and moments; 4 + 8 = 12 B in fp32).
Pure Python.
"""
from __future__ import annotations

import math

from .config import MIXED_18, ModelConfig, ParallelConfig, PrecisionConfig
from .params import stage_params, total_params


def _positive(name: str, value, zero_ok: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or value < 0 or (value == 0 and not zero_ok):
        raise ValueError(f"{name} must be a finite number {'>= 0' if zero_ok else '> 0'} (seconds), got {value!r}")
    return float(value)


def young_interval(save_seconds: float, mtbf_seconds: float) -> float:
    """Young's optimal seconds of training between checkpoints: sqrt(2 delta M)."""
    return math.sqrt(2 * _positive("save_seconds", save_seconds) * _positive("mtbf_seconds", mtbf_seconds))


def daly_interval(save_seconds: float, mtbf_seconds: float) -> float:
    """Daly's higher-order optimum (2006, Eq. 37): Young's with corrections; M when delta >= 2M."""
    d, m = _positive("save_seconds", save_seconds), _positive("mtbf_seconds", mtbf_seconds)
    if d >= 2 * m:
        return m
    x = d / (2 * m)
    return math.sqrt(2 * d * m) * (1 + math.sqrt(x) / 3 + x / 9) - d


def goodput(interval: float, save_seconds: float, mtbf_seconds: float, restart_seconds: float = 0.0,
            write_lag_seconds: float = 0.0) -> float:
    """Fraction of wall time kept as training (module docstring), clipped at 0.

    ``interval``: seconds of training between checkpoints; ``save_seconds``: seconds training is
    blocked per checkpoint; ``write_lag_seconds``: with async saving, how long after the block the
    checkpoint becomes durable (0 for a synchronous save)."""
    tau = _positive("interval", interval)
    block = _positive("save_seconds", save_seconds, zero_ok=True)
    m = _positive("mtbf_seconds", mtbf_seconds)
    lost = _positive("restart_seconds", restart_seconds, zero_ok=True) + (tau + block) / 2 + \
        _positive("write_lag_seconds", write_lag_seconds, zero_ok=True)
    return max(0.0, tau / (tau + block) * (1 - lost / m))


def best_goodput(save_seconds: float, mtbf_seconds: float, restart_seconds: float = 0.0,
                 write_lag_seconds: float = 0.0) -> dict:
    """{"interval": Daly's interval (at least 1 s), "goodput": at it}."""
    tau = max(1.0, daly_interval(save_seconds, mtbf_seconds)) if save_seconds > 0 else 1.0
    return {"interval": tau, "goodput": goodput(tau, save_seconds, mtbf_seconds, restart_seconds, write_lag_seconds)}


def checkpoint_bytes(model: ModelConfig, par: ParallelConfig, precision: PrecisionConfig = MIXED_18,
                     fully_parallel: bool = True) -> dict:
    """Bytes a checkpoint of ``model`` under layout ``par`` holds, and per rank.

    {"total", "per_param", "max_rank", "writers"}: ``total`` = parameters x (bytes_param +
    bytes_optim); ``max_rank``: the most any rank writes. With the distributed optimizer (or ZeRO)
    and ``fully_parallel`` (Megatron's default --ckpt-fully-parallel-save) every data-parallel rank
    writes 1/dp of its stage (experts: 1/edp); otherwise data-parallel rank 0 of each (TP, PP) rank
    writes its whole stage and the other dp - 1 write nothing."""
    per = precision.bytes_param + precision.bytes_optim
    sharded = fully_parallel and par.optimizer_shard_stage >= 1
    dp_split, edp_split = (par.dp * par.cp, par.edp) if sharded else (1, 1)
    ranks = [stage_params(model, par, s) for s in range(par.pp)]
    max_rank = max(per * (c["dense"] / dp_split + c["expert"] / edp_split) for c in ranks)
    writers = par.world_size if sharded else par.world_size // (par.dp * par.cp)
    return {"total": total_params(model) * per, "per_param": per, "max_rank": max_rank, "writers": writers}


def save_seconds(bytes_per_rank: float, rank_bandwidth: float, total_bytes: float | None = None,
                 filesystem_bandwidth: float | None = None) -> float:
    """Seconds to write a checkpoint: the slowest rank at ``rank_bandwidth`` (bytes/s), or the
    whole checkpoint at the file system's aggregate ``filesystem_bandwidth``, whichever is longer."""
    t = _positive("bytes_per_rank", bytes_per_rank, zero_ok=True) / _positive("rank_bandwidth", rank_bandwidth)
    if filesystem_bandwidth is not None:
        t = max(t, _positive("total_bytes", total_bytes or 0, zero_ok=True) /
                _positive("filesystem_bandwidth", filesystem_bandwidth))
    return t

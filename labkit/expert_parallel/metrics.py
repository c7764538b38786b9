"""Megatron's MoE log values of one iteration, gathered from every rank (chapter "Expert parallelism").

Megatron's ``MoEMetricsTracker`` (megatron/core/transformer/moe/moe_logging.py @ d98e8a64) records
``load_balancing_loss`` and ``z_loss`` per layer and microbatch, sums over the tp x cp shards of a
microbatch, averages over data-parallel replicas, scales by 1 / microbatches and averages over
the MoE layers; the training log prints them beside ``lm loss``, which stays the language-model
loss. labkit does the same with one world-wide sum of every rank's table (labkit/moe.py), on an
uncounted group: logging is not training traffic.
"""
from __future__ import annotations

from .. import comm
from ..groups import Group, uncounted
from ..moe_stats import stats_table, summarize


def step_metrics(chunks, groups: dict[str, Group], cfg, topo) -> dict | None:
    """{"load_balancing_loss", "z_loss" (when on), "dropped_fraction", "tokens_per_expert"} of the
    iteration just run, equal on every rank; resets the layers' statistics. None without MoE."""
    if cfg.num_experts is None:
        return None
    table = sum(stats_table(c, cfg.num_layers, cfg.num_experts) for c in chunks)
    device = next(p for c in chunks for p in c.parameters()).device
    table = comm.all_reduce(uncounted(groups["world"]), table.to(device)).cpu()
    return summarize(table, cfg, topo.dp, topo.tp, cfg.num_microbatches(topo))

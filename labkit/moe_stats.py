"""MoE statistics (tokens per expert, dropped tokens, the aux losses), kept only when attached.

Chapter "Expert parallelism". A router records nothing by itself (``Router.stats`` is None): the
caller that logs or plots them attaches a table (:func:`attach`), as Megatron's training loop
owns its ``MoEMetricsTracker``. ``labkit.train`` attaches it for MoE models (Megatron's log prints
``load_balancing_loss`` beside ``lm loss``), ``labkit.reference`` too; nothing else pays for it.
"""
from __future__ import annotations

import torch
from torch import nn

from .moe import moe_layers


def attach(model: nn.Module) -> None:
    """Start keeping statistics in every router of ``model`` (idempotent)."""
    for layer in moe_layers(model):
        if layer.router.stats is None:
            layer.router.stats = {}


def detach(model: nn.Module) -> None:
    """Stop keeping statistics (and drop what was kept)."""
    for layer in moe_layers(model):
        layer.router.stats = None


STATS = ("dropped", "routed", "load_balancing_loss", "z_loss")   # after the E token counts


def stats_table(model: nn.Module, num_layers: int, num_experts: int, reset: bool = True):
    """[num_layers, E + 4] float64, summed over the forwards since the last reset: per layer, the
    tokens routed to each expert (before dropping), then the :data:`STATS` (aux / coeff, and the
    mean squared log-sum-exp, as Megatron records them). Summed over ranks, it is the step's."""
    table = torch.zeros(num_layers, num_experts + len(STATS), dtype=torch.float64)
    for layer in moe_layers(model):
        stats = layer.router.stats or {}
        if "tokens_per_expert" in stats:
            table[layer.layer_number, :num_experts] = stats["tokens_per_expert"].cpu()
        for i, name in enumerate(STATS):
            if name in stats:
                table[layer.layer_number, num_experts + i] = stats[name].cpu()
        if reset:
            stats.clear()
    return table


def summarize(table, cfg, dp: int, tp: int, num_microbatches: int) -> dict:
    """Megatron's logged MoE values of one iteration from the world's summed :func:`stats_table`:
    ``load_balancing_loss`` (aux / coeff: summed over a microbatch's tp shards, averaged over dp
    and the microbatches, then over the MoE layers; ``MoEMetricsTracker``), ``z_loss`` (averaged
    over tp x dp too), the dropped fraction of token copies, and the tokens per expert per layer."""
    E, pattern = cfg.num_experts, cfg.moe_layers()
    n, rows = sum(pattern), [i for i, moe in enumerate(pattern) if moe]
    out = {"tokens_per_expert": [table[i, :E].tolist() for i in rows],
           "dropped_fraction": float(table[:, E].sum() / table[:, E + 1].sum())}
    if cfg.moe_aux_loss_coeff > 0 and cfg.moe_router_load_balancing_type != "none":
        out["load_balancing_loss"] = float(table[:, E + 2].sum()) / (dp * num_microbatches * n)
    if cfg.moe_z_loss_coeff is not None:
        out["z_loss"] = float(table[:, E + 3].sum()) / (tp * dp * num_microbatches * n)
    return out

"""Planner: enumerate valid layouts, drop those that do not fit, rank by predicted throughput.

Chapter "Planning a run". For a model, a cluster and a global batch size, every (TP, PP, CP, EP,
DP, micro batch, recompute, ZeRO stage) that passes Megatron's rules is costed with ``memory.py``
(peak over pipeline stages) and ``perf.py``. A layer count that PP does not divide is tried with
Megatron's ``account_for_embedding/loss_in_pipeline_split`` when that makes it valid. The usual
heuristics (TP within a node, PP across nodes, DP for the rest) are not imposed: they come out of
the cost model, and ``explain`` says why the winner beats the best layout of each other shape.
Every layout is costed under one attention kernel (``attention``, default "flash", Megatron-Core's
default; see ``memory.py``), which the result records and ``explain`` states.
"""
from __future__ import annotations

from ..validate import positive_int
from .config import MIXED_18, ModelConfig, ParallelConfig, PrecisionConfig, validate
from .hardware import Cluster
from .memory import check_attention, peak_memory
from .overlap import MEGATRON_DEFAULTS, OverlapConfig
from .perf import step_time


def _divisors(n):
    return [d for d in range(1, n + 1) if n % d == 0]


def _split(model: ModelConfig, pp: int) -> dict:
    """Megatron's uneven-split flags that make ``num_layers`` fit ``pp`` stages (empty if even)."""
    if model.num_layers % pp == 0:
        return {}
    for emb, loss in ((False, True), (True, True)):
        if (model.num_layers + emb + loss) % pp == 0:
            return {"account_for_embedding_in_pipeline_split": emb, "account_for_loss_in_pipeline_split": loss}
    return {}


def candidate_layouts(model: ModelConfig, cluster: Cluster, global_batch_size: int,
                      micro_batch_sizes=(1, 2, 4, 8), recompute=(None, "selective", "full"),
                      zero_stages=(1,), max_tp=None, context_parallel_sizes=(1,),
                      expert_parallel_sizes=(1,)):
    """Yield (ParallelConfig, None) for valid layouts and (None, reason) for invalid ones."""
    world = cluster.world_size
    max_tp = max_tp or 2 * cluster.gpus_per_node
    for tp in [d for d in _divisors(world) if d <= max_tp]:
        for cp in [c for c in context_parallel_sizes if (world // tp) % c == 0]:
            for pp in _divisors(world // (tp * cp)):
                for ep in expert_parallel_sizes:
                    for mb in micro_batch_sizes:
                        for rec in recompute:
                            for z in zero_stages:
                                try:
                                    par = ParallelConfig(world, tp, pp, context_parallel_size=cp,
                                                         expert_model_parallel_size=ep, micro_batch_size=mb,
                                                         global_batch_size=global_batch_size,
                                                         sequence_parallel=tp > 1, zero_stage=z,
                                                         use_distributed_optimizer=z >= 1,
                                                         recompute_granularity=rec, **_split(model, pp))
                                    validate(model, par)
                                except ValueError as err:
                                    yield None, str(err)
                                    continue
                                yield par, None


def plan(model: ModelConfig, cluster: Cluster, global_batch_size: int,
         precision: PrecisionConfig = MIXED_18, headroom: float = 0.9,
         overlap: OverlapConfig = MEGATRON_DEFAULTS, fp8: bool = False, attention: str = "flash",
         **search) -> dict:
    """Rank the layouts that fit in ``headroom`` x GPU memory by predicted tokens/s.

    Returns {"ranked": [rows best first], "too_big": n, "invalid": n, "capacity": bytes,
    "attention": the kernel every layout's memory was counted with}. For a MoE model EP is
    searched too (every divisor of num_experts), unless ``expert_parallel_sizes`` is given.
    """
    check_attention(attention)
    gbs = global_batch_size
    positive_int("global_batch_size", gbs)
    if not 0 < headroom <= 1:   # also refuses nan
        raise ValueError(f"headroom must be in (0, 1], the share of GPU memory usable, got {headroom!r}")
    if model.num_experts and "expert_parallel_sizes" not in search:
        search = dict(search, expert_parallel_sizes=tuple(
            e for e in _divisors(model.num_experts) if e <= cluster.world_size))
    capacity = headroom * cluster.gpu.memory_bytes
    ranked, too_big, invalid = [], 0, 0
    for par, reason in candidate_layouts(model, cluster, global_batch_size, **search):
        if par is None:
            invalid += 1
            continue
        mem = peak_memory(model, par, precision, attention=attention)
        if mem > capacity:
            too_big += 1
            continue
        perf = step_time(model, par, cluster, precision, overlap, fp8)
        ranked.append({"tp": par.tp, "pp": par.pp, "cp": par.cp, "ep": par.ep, "dp": par.dp,
                       "micro_batch_size": par.micro_batch_size,
                       "num_microbatches": global_batch_size // (par.micro_batch_size * par.dp),
                       "recompute": par.recompute_granularity or "none",
                       "zero_stage": par.zero_stage, "peak_memory_gib": mem / 2 ** 30,
                       "step_time_s": perf["step_time"], "tokens_per_s": perf["tokens_per_s"],
                       "mfu": perf["mfu"], "mfu_palm": perf["mfu_palm"], "bubble_s": perf["bubble"], "tp_comm_s": perf["tp_comm"],
                       "pp_comm_s": perf["pp_comm"], "dp_comm_s": perf["dp_comm"], "parallel": par})
    ranked.sort(key=lambda r: -r["tokens_per_s"])
    return {"ranked": ranked, "too_big": too_big, "invalid": invalid, "capacity": capacity,
            "attention": attention}


def explain(result: dict, cluster: Cluster) -> list:
    """Why the winner wins: compare it with the best layout of each other (TP, PP) shape family."""
    ranked, kernel = result["ranked"], f"{result.get('attention', 'flash')} attention"
    if not ranked:
        return [f"no layout fits (memory with {kernel}): more GPUs, ZeRO-3, recompute or a smaller "
                f"micro batch are needed"]
    best = ranked[0]
    lines = [f"winner: TP={best['tp']} PP={best['pp']} DP={best['dp']} mb={best['micro_batch_size']} "
             f"recompute={best['recompute']}: {best['tokens_per_s']:.0f} tokens/s, "
             f"MFU {best['mfu']:.1%}, {best['peak_memory_gib']:.1f} GiB (memory with {kernel})"]
    seen = set()
    for r in ranked[1:]:
        key = ("TP inside a node" if cluster.gpus_per_node % r["tp"] == 0 else "TP spanning nodes",
               "PP" if r["pp"] > 1 else "no PP", "CP" if r["cp"] > 1 else "", "EP" if r["ep"] > 1 else "")
        if key in seen:
            continue
        seen.add(key)
        costs = {k: r[k] - best[k] for k in ("bubble_s", "tp_comm_s", "pp_comm_s", "dp_comm_s")}
        worst = max(costs, key=costs.get)
        lines.append(f"best with {', '.join(x for x in key if x)} (TP={r['tp']} PP={r['pp']} CP={r['cp']} "
                     f"EP={r['ep']} DP={r['dp']}): "
                     f"{r['tokens_per_s'] / best['tokens_per_s']:.0%} of the winner's throughput, "
                     f"mostly from {worst[:-2].replace('_', ' ')} (+{costs[worst]:.3f} s/step)")
    return lines


def min_nodes(model: ModelConfig, cluster: Cluster, global_batch_size_per_node=None, max_nodes=128,
              precision: PrecisionConfig = MIXED_18, **search):
    """The fewest nodes on which some layout fits (global batch = nodes x GPUs x 1 unless given);
    ``search`` goes to :func:`plan` (``attention``, the sizes searched)."""
    for nodes in range(1, max_nodes + 1):
        c = cluster.with_(nodes=nodes)
        gbs = (global_batch_size_per_node or c.gpus_per_node) * nodes
        result = plan(model, c, gbs, precision, **search)
        if result["ranked"]:
            return nodes, result
    return None, None

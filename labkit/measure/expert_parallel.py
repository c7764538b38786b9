"""Expert parallelism measured against ``labkit.calc`` (chapter "Expert parallelism", its lab, and
tests/test_expert_parallel.py).

* bytes: what ``labkit.comm`` counted on the ep group vs ``calc.comm.ep_layer_bytes`` (a balanced
  router) and ``calc.comm.ep_routed_bytes`` for the rows each rank really routed, those rows
  taken from the single-device model routing the same microbatches (:func:`routed_counts`);
* memory per rank held at the gradient sync vs ``calc.memory.memory_per_stage`` (:func:`memory_worker`);
* load balance and drops over training, on one device (:func:`load_balance`, :func:`drop_sweep`);
* the Mixtral-like and DeepSeek-like presets on H100 nodes: labkit's memory model beside
  Megatron's own estimate (:func:`preset_memory`).

The figures are drawn by ``labkit/figures/expert_parallel.py``.
"""
from __future__ import annotations


def memory_worker(configs: list[dict], steps: int = 2, seed: int = 0) -> list[dict]:
    """On every rank: for each TrainConfig (kwargs), train ``steps`` steps (AdamW's moments exist
    after the first) and return the bytes held at the last gradient sync and the parameter counts."""
    from ..config import train_config
    from ..data import load_tokens
    from ..param_attrs import is_expert
    from ..training import build_rank, rank_microbatches
    tokens, out = load_tokens(), []
    for kw in configs:
        cfg = train_config(**kw)
        topo, groups, engine = build_rank(cfg, seed)
        for it in range(steps):
            engine.step(rank_microbatches(cfg, topo, it, seed, tokens))
        params = [p for c in engine.runner.chunks for p in c.parameters()]
        out.append(dict(engine.dp.memory, expert_params=sum(p.numel() for p in params if is_expert(p)),
                        dense_params=sum(p.numel() for p in params if not is_expert(p))))
    return out


def routed_counts(world_size: int, seed: int = 0, iteration: int = 0, **config) -> list:
    """Tokens each data-parallel rank routes to each expert in iteration ``iteration`` (at the
    initial weights, so iteration 0 matches a run's first step), on ONE device:
    ``counts[dp_rank][microbatch][moe layer]`` = [E] (the routing map before any dropping)."""
    import torch

    from .. import data
    from ..config import train_config
    from ..model import GPT
    from ..moe import moe_layers
    cfg = train_config(**config)
    topo = cfg.validate(world_size)
    model = GPT(cfg.model_config(), seed=seed).to(getattr(torch, cfg.params_dtype))
    seen = []
    for layer in moe_layers(model):
        layer.router.register_forward_hook(lambda m, args, out: seen.append(out[1].sum(0).tolist()))
    inputs, labels = data.get_batch(data.load_tokens(), iteration, cfg.global_batch(topo), cfg.seq_length, seed)
    counts = []
    for r in range(topo.dp):
        per_mb = []
        for x, y in data.microbatches(inputs, labels, cfg.micro_batch_size, topo.dp, r):
            seen.clear()
            with torch.no_grad():
                model.loss(x, y)
            per_mb.append(list(seen))
        counts.append(per_mb)
    return counts


def expected_alltoall_bytes(counts: list, num_experts: int, ep: int, hidden_size: int,
                            bytes_per_element: int) -> list[float]:
    """Bytes each rank sends in all-to-alls over one iteration (dropless, no padding), from
    :func:`routed_counts`, by ``calc.comm.ep_routed_bytes``. Layout: tp = pp = cp = 1, so dp rank
    r is ep rank r % ep of the ep group made of ranks [r - r % ep, ... + ep)."""
    from ..calc.comm import ep_routed_bytes
    n_local, out = num_experts // ep, []
    for r, mine in enumerate(counts):
        base, me, total = r - r % ep, r % ep, 0.0
        for j, layers in enumerate(mine):
            for lay, c in enumerate(layers):
                to_others = sum(c) - sum(c[me * n_local:(me + 1) * n_local])
                from_others = sum(sum(counts[base + q][j][lay][me * n_local:(me + 1) * n_local])
                                  for q in range(ep) if q != me)
                total += ep_routed_bytes(to_others, from_others, hidden_size, bytes_per_element)["all_to_all"]
        out.append(total)
    return out


def load_balance(steps: int, seed: int = 0, **config) -> dict:
    """Tokens per expert per step (first MoE layer), load_balancing_loss and dropped fraction over
    ``steps`` steps of single-device training (``labkit.reference``, the exact loop of every parity
    test): {"tokens_per_expert": [steps][E], "load_balancing_loss": [...], "dropped": [...], "losses"}."""
    from ..reference import train_reference
    out = train_reference(steps=steps, seed=seed, capture_grads=True, **config)   # the dict form
    moe = out["moe"]
    return {"tokens_per_expert": [m["tokens_per_expert"][0] for m in moe],
            "load_balancing_loss": [m.get("load_balancing_loss") for m in moe],
            "dropped": [m["dropped_fraction"] for m in moe], "losses": out["losses"]}


def imbalance(tokens_per_expert) -> float:
    """max / mean tokens per expert: 1.0 is perfect balance; the busiest expert (and its rank)
    sets the pace, and with a capacity factor below this value tokens are dropped."""
    return max(tokens_per_expert) * len(tokens_per_expert) / sum(tokens_per_expert)


def drop_sweep(factors, steps: int, seed: int = 0, **config) -> list[dict]:
    """Dropped fraction of token copies (mean over ``steps`` steps) for each capacity factor,
    with calc's balanced-router prediction beside it."""
    from ..calc.moe import dropped_fraction_balanced
    rows = []
    for f in factors:
        lb = load_balance(steps, seed, moe_expert_capacity_factor=f, **config)
        rows.append({"capacity_factor": f, "dropped": sum(lb["dropped"]) / steps,
                     "balanced_prediction": dropped_fraction_balanced(f)})
    return rows


H100_NODE = 8  # GPUs per node


def preset_memory(name: str, world_size: int, precision="mixed18", **layout) -> dict:
    """GiB per GPU for a calc preset on ``world_size`` H100s: labkit's model (every pipeline stage,
    peak) beside Megatron's own estimate (first stage: weights + optimizer, activations)."""
    from .. import calc
    model = calc.model(name)
    par = calc.ParallelConfig(world_size=world_size, **layout)
    rows = calc.memory_per_stage(model, par, calc.PRECISIONS[precision])
    est = calc.megatron_estimate(world_size, **calc.flops.megatron_kwargs(model, par))
    gib = 2 ** 30
    first = rows[0]
    return {"model": name, "gpus": world_size, "nodes": world_size // H100_NODE,
            "layout": f"TP{par.tp} PP{par.pp} EP{par.ep} ETP{par.etp} DP{par.dp} (expert-DP {par.edp})",
            "labkit_first_stage_weights_optimizer_gib": (first["params"] + first["grads"] + first["optimizer"]) / gib,
            "labkit_first_stage_activations_gib": first["activations"] / gib,
            "labkit_peak_gib": max(r["total"] for r in rows) / gib,
            "megatron_weights_optimizer_gib": est["weight_and_optimizer_bytes"] / gib,
            "megatron_activations_gib": est["activation_bytes"] / gib,
            "megatron_total_gib": est["total_bytes"] / gib,
            "fits_h100": max(r["total"] for r in rows) <= calc.GPUS["H100-80GB"].memory_bytes}

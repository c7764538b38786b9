"""Measurements for the data-parallel chapter and lab: parity, bytes, memory, overlap, weak scaling.

Chapter "Data parallelism". Each ``*_worker`` runs on every rank under ``labkit.launch`` and uses
the real path (``labkit.training.build_rank`` -> Engine -> labkit/data_parallel/); the
caller compares what comes back with ``labkit.reference`` (parity) and ``labkit.calc``
(bytes, memory). Several variants run inside one launch: groups are built once and their counters
reset between variants, so a launch is paid once (a launch of 4 ranks costs under 0.1 s after the first; README, Benchmarks).
"""
from __future__ import annotations

import torch
import torch.distributed as dist

OPS = ("all_reduce", "reduce_scatter", "all_gather")  # the collectives of DP and ZeRO
VARIANTS = {  # name -> TrainConfig overrides; the chapter's table has one row per name
    "naive": {},
    "bucketed": {"ddp_bucket_size": 4096},
    "zero1": {"zero_stage": 1},
    "zero2": {"zero_stage": 2},
    "zero3": {"zero_stage": 3},
}


def _setup(config: dict, seed: int = 0):
    """(cfg, topo, groups, engine) for one variant, built the way labkit.train builds a rank."""
    from ..config import train_config
    from ..training import build_rank
    cfg = train_config(**config)
    topo, groups, engine = build_rank(cfg, seed)
    return cfg, topo, groups, engine


def _batches(cfg, topo, it: int, seed: int, tokens):
    from ..training import rank_microbatches
    return rank_microbatches(cfg, topo, it, seed, tokens)


def _flat(named: dict) -> torch.Tensor:
    return torch.cat([t.reshape(-1) for t in named.values()])


def parity_worker(variants: dict, steps: int, seed: int, base: dict) -> dict:
    """Train every variant ``steps`` iterations; rank 0 returns, per variant and step, the full
    parameters, the loss and grad norm; every rank reports how far its replica is from rank 0's."""
    from ..data import load_tokens
    tokens, out = load_tokens(), {}
    for name, overrides in variants.items():
        cfg, topo, groups, engine = _setup({**base, **overrides}, seed)
        params, losses, norms, comm = [], [], [], []
        for it in range(steps):
            loss, norm = engine.step(_batches(cfg, topo, it, seed, tokens))
            full = engine.dp.full_parameters()
            params.append(full if dist.get_rank() == 0 else None)
            losses.append(loss)
            norms.append(norm)
            comm.append(groups["dp"].stats.snapshot())
            groups["dp"].stats.reset()
        mine = _flat(full)
        ref = mine.clone()
        dist.broadcast(ref, src=0)  # bookkeeping, not counted: compare replicas with rank 0
        out[name] = {"params": params, "losses": losses, "grad_norms": norms, "comm": comm,
                     "replica_max_diff": float((mine - ref).abs().max()),
                     "memory": engine.dp.memory, "num_microbatches": cfg.num_microbatches(topo)}
    return out


def memory_worker(stages, base: dict, seed: int = 0, steps: int = 2) -> dict:
    """{stage: bytes held (params, grads, optimizer)} on this rank at the last step's grad sync."""
    from ..data import load_tokens
    tokens, out = load_tokens(), {}
    for stage in stages:
        cfg, topo, groups, engine = _setup({**base, "zero_stage": stage}, seed)
        for it in range(steps):  # step 2: AdamW's moments exist (created by the first step)
            engine.step(_batches(cfg, topo, it, seed, tokens))
        out[stage] = dict(engine.dp.memory, num_params=engine.dp.num_params)
    return out


def overlap_worker(base: dict, bucket_size: int, iterations: int = 4, seed: int = 0) -> dict:
    """Time single-microbatch iterations of naive and bucketed DDP, phase by phase (gloo on CPU:
    on NCCL a collective's future completes when it is queued, not done, so its intervals would say
    nothing; use the PyTorch profiler on GPUs).

    Returns {"naive"|"bucketed": {"phases": [(label, t0, t1)], "all_reduce": [(label, t0, t1)],
    "iteration_ms": [...]}}, times in ms from the iteration's start, for the iteration of median
    time (the first, warm-up, excluded). The all-reduce intervals are measured: launch time, and
    completion time taken by a callback on the collective's future (gloo runs it on its own
    thread, so it overlaps the backward).
    """
    from ..config import train_config
    from ..data import load_tokens
    from ..data_parallel.ddp import BucketedDataParallel, NaiveDataParallel
    from ..groups import build_groups
    from ..launcher import device, now
    from ..model import GPT
    if device().type != "cpu":
        raise ValueError("overlap_worker measures gloo's collectives on the CPU: launch it with backend='gloo'")
    cfg = train_config(**base)
    topo = cfg.validate(dist.get_world_size())
    groups = build_groups(topo)
    tokens, out = load_tokens(), {}
    for name in ("naive", "bucketed"):
        model = GPT(cfg.model_config(), seed=seed).to(device())
        events: list = []
        named = list(model.named_parameters())
        dp = (NaiveDataParallel(named, groups["dp"], cfg, events=events) if name == "naive" else
              BucketedDataParallel(named, groups["dp"], cfg, bucket_size, events=events))
        times, records = [], []
        for it in range(iterations):
            (x, y), = _batches(cfg, topo, it, seed, tokens)
            events.clear()
            dist.barrier()
            t = [now()]
            loss = model.loss(x, y)
            t.append(now())
            with dp.grad_sync_context(is_last_microbatch=True):
                loss.backward()
            t.append(now())
            dp.finish_grad_sync()
            t.append(now())
            dp.step()
            t.append(now())
            ms = [(v - t[0]) * 1e3 for v in t]
            times.append(ms[-1])
            records.append({"phases": [(label, ms[i], ms[i + 1]) for i, label in
                                       enumerate(("forward", "backward", "wait for grads", "optimizer"))],
                            "all_reduce": [(lbl, (a - t[0]) * 1e3, (b - t[0]) * 1e3)
                                           for _, lbl, a, b in sorted(events, key=lambda e: e[2])]})
        later = sorted(range(1, iterations), key=lambda i: times[i]) or [0]
        out[name] = dict(records[later[len(later) // 2]], iteration_ms=times)
    return out


def weak_scaling(world_sizes=(1, 2), steps: int = 6, **config) -> list[dict]:
    """Weak scaling (data/h200x2_gpt2large_strategies.csv: DP 2 kept the 1-GPU step time with twice
    the global batch):
    the same micro batch per rank, global batch = micro batch x dp, median step time of
    ``labkit.train`` (first step dropped: warm-up). Times vary from run to run."""
    import statistics

    from ..training import train
    rows = []
    for n in world_sizes:
        res = train(world_size=n, steps=steps, log_interval=0,
                    global_batch_size=config.get("micro_batch_size", 2) * n, **config)
        ms = statistics.median(res.iteration_ms[1:])
        rows.append({"dp": n, "global batch": res.config.global_batch_size, "step ms (median)": round(ms, 1),
                     "samples/s": round(res.config.global_batch_size / ms * 1e3, 1)})
    return rows


def reference_params(steps: int, seed: int = 0, **config) -> tuple[list[dict], list[float]]:
    """Single-device parameters after each of ``steps`` steps, and its losses: ``labkit.reference``
    run for k = 1..steps (an independent loop: whole global batch, one backward, plain AdamW)."""
    from ..reference import train_reference
    params = [{n: p.detach() for n, p in train_reference(steps=k, seed=seed, return_model=True,
                                                         **config)["model"].named_parameters()}
              for k in range(1, steps + 1)]
    return params, train_reference(steps=steps, seed=seed, **config)


def parity_table(results: list[dict], ref_params: list[dict], ref_losses: list[float], dp: int,
                 param_tol: float = 5e-6, loss_tol: float = 2e-6) -> list[dict]:
    """One row per variant: max |param - single device| over all steps and ranks' replicas, and
    max |loss - single device|, each against its fp32 tolerance (``labkit.measure.roundoff``);
    bytes per rank per step by op (rank 0, step 1)."""
    from . import roundoff
    rows = []
    for name, out in results[0].items():
        dparam = max(float((out["params"][k][n] - p).abs().max()) for k, ref in enumerate(ref_params)
                     for n, p in ref.items())
        dloss = max(abs(a - b) for a, b in zip(out["losses"], ref_losses))
        replicas = max(r[name]["replica_max_diff"] for r in results)
        rows.append({"dp": dp, "variant": name, "microbatches": out["num_microbatches"],
                     "max |dparam|": roundoff(dparam, param_tol), "max |dloss|": roundoff(dloss, loss_tol),
                     "replicas differ": replicas != 0.0, "_dparam": dparam,
                     **{op: int(out["comm"][0].get(op, {}).get("bytes", 0)) for op in OPS}})
    return rows

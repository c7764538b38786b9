"""Instruments of the chapter "Putting it together: PTD-P": a composed run, and the
per-strategy memory at CPU scale next to the 2xH200 table (data/h200x2_gpt2large_strategies.csv).
The rank grid is drawn by ``labkit.figures.ptdp``.

    composed_run(world, **layout)               losses, gradients vs one device, bytes vs calc
    strategy_memory(strategies)                 bytes held per rank: model states + activations
"""
from __future__ import annotations

from ..config import TrainConfig


def composed_run(world_size: int, steps: int = 5, backend: str = "gloo", **config) -> dict:
    """``labkit.train`` with ``capture_grads`` and the single-device reference on the same
    arguments: {"losses", "reference", "max_loss_diff", "max_grad_diff", "bytes": rows of
    (rank, group, op, counted per step, labkit.calc.composed)}."""
    from ..calc.composed import labkit_step_bytes
    from ..reference import train_reference
    from ..training import train
    res = train(world_size=world_size, steps=steps, log_interval=0, capture_grads=True, backend=backend,
                **config)
    ref = train_reference(world_size=world_size, steps=steps, capture_grads=True, **config)
    model, par = res.config.megatron_view(world_size)
    e = 8 if res.config.params_dtype == "float64" else 4
    rows = []
    for r, rank in enumerate(res.ranks):
        c = rank["coords"]
        calc = labkit_step_bytes(model, par, c["pp"], e)
        for group in ("tp", "pp", "dp", "embd"):
            counted = {op: v["bytes"] / steps for op, v in rank["comm"].get(group, {}).items()}
            for op in sorted(set(counted) | set(calc.get(group, {}))):
                rows.append({"rank": r, "group": group, "op": op, "counted": counted.get(op, 0.0),
                             "labkit.calc": calc.get(group, {}).get(op, 0.0)})
    return {"losses": res.losses, "reference": ref["losses"],
            "max_loss_diff": max(abs(a - b) for a, b in zip(res.losses, ref["losses"])),
            "max_grad_diff": max(float((res.grads[n] - g).abs().max()) for n, g in ref["grads"].items()),
            "bytes": rows, "result": res}


def _memory_worker(layouts: dict, base: dict, seed: int) -> dict:
    """Per layout: bytes this rank holds at its gradient sync (parameters, gradients, AdamW
    moments) and the most activation bytes autograd keeps at once during one step."""
    from .. import data
    from ..training import build_rank, rank_microbatches
    from .activations import SavedTensorMeter, saved_activations
    out = {}
    for name, layout in layouts.items():
        cfg = TrainConfig(**{**base, **layout})
        topo, groups, engine = build_rank(cfg, seed)
        mbs = rank_microbatches(cfg, topo, 0, seed, data.load_tokens())
        if topo.pp > 1:
            engine.runner.meters.append(SavedTensorMeter())   # attached: training does not count
            engine.step(mbs)
            act = engine.runner.last_run.peak_activation_bytes
        else:   # one microbatch's saved tensors: the backward frees them before the next forward
            chunk = engine.runner.chunks[0]
            saved, loss = saved_activations(chunk, *mbs[0], exclude=list(chunk.parameters()))
            del loss
            act = saved.total_bytes
            engine.step(mbs)
        engine.step(mbs)                                   # AdamW's moments exist after step 1
        held = dict(engine.dp.memory)
        out[name] = {**held, "activations": act, "states": sum(held.values())}
    return out


def strategy_memory(strategies: dict, base: dict, seed: int = 0) -> list[dict]:
    """``strategies``: {name: (world size, TrainConfig overrides)}. One launch per world size;
    returns rows {strategy, rank, states, activations, total} (bytes, fp32 unless base says)."""
    from ..launcher import launch
    by_world: dict[int, dict] = {}
    for name, (world, layout) in strategies.items():
        by_world.setdefault(world, {})[name] = layout
    rows = []
    for world, layouts in by_world.items():
        for r, res in enumerate(launch(_memory_worker, world, layouts, base, seed, backend="gloo")):
            for name, held in res.items():
                rows.append({"strategy": name, "rank": r, "states": held["states"],
                             "activations": held["activations"],
                             "total": held["states"] + held["activations"]})
    order = list(strategies)
    return sorted(rows, key=lambda row: (order.index(row["strategy"]), row["rank"]))

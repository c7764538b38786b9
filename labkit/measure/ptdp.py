"""Instruments of the chapter "Putting it together: PTD-P": the rank grid, a composed run, and the
per-strategy memory at CPU scale next to the 2xH200 table (data/h200x2_gpt2large_strategies.csv).

    draw_grid(Topology(8, tp=2, pp=2))          the ranks coloured by tp, dp and pp group
    composed_run(world, **layout)               losses, gradients vs one device, bytes vs calc
    strategy_memory(strategies)                 bytes held per rank: model states + activations
"""
from __future__ import annotations

from ..config import TrainConfig


def draw_grid(topo, axes_to_draw=("tp", "dp", "pp"), ax=None):
    """One panel per axis: the world's ranks laid out as pp rows x (dp x tp) columns, each group
    of that axis in its own colour, every box labelled with its rank. Returns the Figure."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle
    n = len(axes_to_draw)
    fig, axs = plt.subplots(1, n, figsize=(3.4 * n, 1.0 + 0.9 * topo.pp)) if ax is None else (ax.figure, [ax])
    colours = plt.get_cmap("tab10").colors
    cols = topo.world_size // topo.pp
    for a, axis in zip(axs, axes_to_draw):
        group_of = {r: i for i, g in enumerate(topo.groups(axis)) for r in g}
        for r in range(topo.world_size):
            c = topo.coords(r)
            x, y = r % cols, topo.pp - 1 - c["pp"]
            a.add_patch(Rectangle((x + 0.05, y + 0.05), 0.9, 0.9, color=colours[group_of[r] % 10], alpha=0.75))
            a.text(x + 0.5, y + 0.5, str(r), ha="center", va="center", fontsize=10)
        a.set_xlim(0, cols)
        a.set_ylim(0, topo.pp)
        a.set_xticks([])
        a.set_yticks([y + 0.5 for y in range(topo.pp)], [f"stage {topo.pp - 1 - y}" for y in range(topo.pp)])
        a.set_title(f"{axis} groups: {len(topo.groups(axis))} of {topo.size(axis)}")
        a.set_aspect("equal")
    fig.suptitle(topo.describe() + "  (rank = tp + tp*(dp + dp*pp), Megatron's tp-cp-ep-dp-pp)", fontsize=10)
    fig.tight_layout()
    return fig


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

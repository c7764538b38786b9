"""Figures of the data-parallel chapter and lab, drawn from measured numbers (labkit/dp_measure.py).

``plot_memory``: the classic per-GPU memory chart of ZeRO (Rajbhandari et al. 2020, Fig. 1), bytes
per parameter held for params / grads / optimizer, ZeRO 0-3 side by side for several dp.
``plot_overlap``: the timeline of one iteration, naive vs bucketed DDP: compute phases as bars,
every all-reduce as a bar from its launch to its completion.
"""
from __future__ import annotations

PARTS = (("params", "#4c72b0"), ("grads", "#55a868"), ("optimizer", "#c44e52"))


def plot_memory(held: dict, ax=None):
    """``held[(stage, dp)] = {"params", "grads", "optimizer", "num_params"}`` (bytes, one rank)."""
    import matplotlib.pyplot as plt
    ax = ax or plt.gca()
    dps = sorted({dp for _, dp in held})
    width = 0.8 / len(dps)
    for stage in range(4):
        for j, dp in enumerate(dps):
            row, x, bottom = held[(stage, dp)], stage + (j - (len(dps) - 1) / 2) * width, 0.0
            for part, color in PARTS:
                per_param = row[part] / row["num_params"]
                ax.bar(x, per_param, width * 0.9, bottom=bottom, color=color,
                       label=part if (stage, j) == (0, 0) else None)
                bottom += per_param
            ax.text(x, bottom + 0.2, f"{bottom:g}", ha="center", fontsize=7)
            ax.text(x, -1.0, f"{dp}", ha="center", fontsize=7)
    ax.set_xticks(range(4), ["plain DP\n(ZeRO-0)", "ZeRO-1\noptimizer", "ZeRO-2\n+ grads", "ZeRO-3 / FSDP\n+ params"])
    ax.tick_params(axis="x", pad=14)
    ax.set_ylabel("bytes per parameter on one rank (measured)")
    ax.set_ylim(-1.6, 18)
    ax.set_title(f"fp32 AdamW; the number under each bar is dp ({', '.join(map(str, dps))})")
    ax.legend(loc="upper right")
    return ax


def plot_overlap(out: dict, axes=None):
    """``out`` from ``overlap_worker`` on one rank: {"naive"|"bucketed": {"phases", "all_reduce"}}."""
    import matplotlib.pyplot as plt
    if axes is None:
        _, axes = plt.subplots(2, 1, figsize=(11, 3.8), sharex=True)
    colors = {"forward": "#4c72b0", "backward": "#55a868", "wait for grads": "#cccccc", "optimizer": "#8172b2"}
    for ax, name in zip(axes, ("naive", "bucketed")):
        run = out[name]
        for label, t0, t1 in run["phases"]:
            ax.barh(1, t1 - t0, left=t0, color=colors[label], edgecolor="white", label=label)
        for i, (label, t0, t1) in enumerate(run["all_reduce"]):
            ax.barh(0, max(t1 - t0, 0.3), left=t0, color="#dd8452", edgecolor="black", linewidth=0.3,
                    label="all-reduce" if i == 0 else None)
        end = run["phases"][-1][2]
        ax.set_yticks([0, 1], ["communication", "compute"])
        ax.set_title(f"{name}: {len(run['all_reduce'])} all-reduces, iteration {end:.0f} ms")
    axes[0].legend(*axes[0].get_legend_handles_labels(), loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=7)
    axes[-1].set_xlabel("ms since the start of the iteration (rank 0, measured on gloo)")
    return axes

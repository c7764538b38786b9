"""Figures of the data-parallel chapter and lab, drawn from measured numbers (labkit/measure/dp.py).

``plot_memory``: the classic per-GPU memory chart of ZeRO (Rajbhandari et al. 2020, Fig. 1), bytes
per parameter held for params / grads / optimizer, ZeRO 0-3 side by side for several dp.
``plot_overlap``: the timeline of one iteration, naive vs bucketed DDP: compute phases as bars,
every all-reduce as a bar from its launch to its completion. Both panels get the same x-range,
the one that covers every bar of every panel (``overlap_span``), so neither run is clipped.
Font sizes come from the current matplotlib style (``labkit.figures`` sets the book's).
"""
from __future__ import annotations

PARTS = (("params", "#4c72b0"), ("grads", "#55a868"), ("optimizer", "#c44e52"))
PHASE_COLORS = {"forward": "#4c72b0", "backward": "#55a868", "wait for grads": "#cccccc",
                "optimizer": "#8172b2"}
AR_COLOR = "#dd8452"
MIN_BAR_MS = 0.3          # an all-reduce shorter than this is drawn this wide, to stay visible


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
            if j in (0, len(dps) - 1):      # the first and last dp of each stage: its range
                ax.text(x, bottom + 0.3, f"{bottom:g}", ha="center")
    ax.set_xticks(range(4), ["DP", "ZeRO-1", "ZeRO-2", "ZeRO-3"])
    ax.set_ylabel("bytes per parameter")
    ax.set_ylim(0, 18)
    ax.set_yticks([0, 4, 8, 12, 16])
    ax.legend(loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=3, frameon=False)
    return ax


def overlap_span(out: dict) -> float:
    """The last end time (ms) over every phase and all-reduce bar of every run in ``out``."""
    ends = [t1 for run in out.values() for _, _, t1 in run["phases"]]
    ends += [t0 + max(t1 - t0, MIN_BAR_MS) for run in out.values() for _, t0, t1 in run["all_reduce"]]
    return max(ends)


def plot_overlap(out: dict, axes=None):
    """``out`` from ``overlap_worker`` on one rank: {"naive"|"bucketed": {"phases", "all_reduce"}}."""
    import matplotlib.pyplot as plt
    if axes is None:
        _, axes = plt.subplots(2, 1, figsize=(5, 3.4))
    right = overlap_span(out) * 1.02
    for ax, name in zip(axes, ("naive", "bucketed")):
        run = out[name]
        for label, t0, t1 in run["phases"]:
            ax.barh(1, t1 - t0, left=t0, color=PHASE_COLORS[label], edgecolor="white", label=label)
        for i, (label, t0, t1) in enumerate(run["all_reduce"]):
            ax.barh(0, max(t1 - t0, MIN_BAR_MS), left=t0, color=AR_COLOR, edgecolor="black",
                    linewidth=0.3, label="all-reduce" if i == 0 else None)
        end = run["phases"][-1][2]
        ax.set_yticks([0, 1], ["comm", "compute"])
        ax.set_xlim(0, right)           # every panel covers every bar of every panel
        ax.set_title(f"{name}: {len(run['all_reduce'])} all-reduces, {end:.0f} ms", loc="left")
    handles, labels = axes[0].get_legend_handles_labels()
    axes[-1].legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, -0.62), ncol=3,
                    frameon=False)
    axes[-1].set_xlabel("ms since the start of the iteration (rank 0)")
    return axes

"""Figures of the chapter "Expert parallelism", drawn from labkit's own code (``moe.permute``, the
dispatcher's order, ``Topology``'s two grids) and measurements (``measure.expert_parallel``).

    fig_dispatch(maps, E)        a real routing through the all-to-all dispatcher and back
    fig_load_balance(runs)       each expert's share of the tokens over training, per run
    fig_drops(rows)              dropped fraction against the capacity factor
    fig_expert_grid(topo)        the dense grid and the expert grid over the same ranks
"""
from __future__ import annotations

from .ptdp import draw_groups
from .style import new

COLORS = ["#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860", "#da8bc3", "#8c8c8c"]


def dispatch_layout(routing_maps, num_experts: int):
    """Per rank, the rows of each stage of the all-to-all dispatch: [(token, source rank, expert)].

    ``routing_maps[r]`` [T, E] bool of rank r (top-1); experts split evenly over the ranks. The
    way back retraces these stages, so its last stage is the first one's order again."""
    from ..moe import permute
    n = len(routing_maps)
    n_local = num_experts // n
    stages = {"tokens": [], "permuted": [], "received": [], "by expert": []}
    for r, m in enumerate(routing_maps):
        stages["tokens"].append([(t, r, int(m[t].nonzero()[0])) for t in range(m.shape[0])])
        token, counts = permute(m)
        experts = [e for e in range(num_experts) for _ in range(int(counts[e]))]
        stages["permuted"].append([(int(t), r, e) for t, e in zip(token, experts)])
    for r in range(n):                      # all-to-all: from each source, rows of my experts
        mine = range(r * n_local, (r + 1) * n_local)
        stages["received"].append([row for src in range(n) for row in stages["permuted"][src] if row[2] in mine])
        stages["by expert"].append(sorted(stages["received"][r], key=lambda row: row[2]))  # stable
    stages["combined"] = stages["tokens"]   # all-to-all back, then the inverse permutation
    return stages


TITLES = ["tokens", "perm. 1", "all-to-all", "perm. 2,\nexperts", "back,\nunperm."]


def fig_dispatch(routing_maps, num_experts: int):
    """One box per row (``t3 r0``: token 3 of rank 0), coloured by its expert, at each stage of
    the dispatch and the way back; a box outlined in black arrived from the other rank."""
    from matplotlib.patches import Rectangle
    stages = dispatch_layout(routing_maps, num_experts)
    n = len(routing_maps)
    rows = max(len(s) for st in stages.values() for s in st)
    fig, ax = new(5.0, 0.22 * (rows + 1.5) * n + 0.9)
    col_w, box_w = 1.0, 0.86
    for col, (name, per_rank) in enumerate(stages.items()):
        for r, seq in enumerate(per_rank):
            y0 = r * (rows + 1.5)
            for i, (t, src, e) in enumerate(seq):
                away = src != r and name in ("received", "by expert")
                ax.add_patch(Rectangle((col * col_w, y0 + i), box_w, 0.86, fc=COLORS[e % len(COLORS)],
                                       ec="black" if away else "none", lw=1.6))
                ax.text(col * col_w + box_w / 2, y0 + i + 0.45, f"t{t} r{src}", ha="center",
                        va="center", color="white")
        ax.text(col * col_w + box_w / 2, -0.4, TITLES[col], ha="center", va="bottom")
    for r in range(n):
        lo, hi = r * num_experts // n, (r + 1) * num_experts // n - 1
        ax.text(-0.12, r * (rows + 1.5) + rows / 2, f"rank {r}\ne{lo}-{hi}", ha="right", va="center")
    ax.legend([Rectangle((0, 0), 1, 1, color=COLORS[e]) for e in range(num_experts)],
              [f"expert {e}" for e in range(num_experts)], ncol=num_experts, frameon=False,
              loc="upper center", bbox_to_anchor=(0.45, 0.0), handlelength=1.0, columnspacing=0.8)
    ax.set_xlim(-0.75, len(stages) * col_w)
    ax.set_ylim(n * (rows + 1.5) - 1.2, -2.2)
    ax.axis("off")
    fig.tight_layout()
    return fig


def fig_load_balance(runs: dict):
    """``runs[label]["tokens_per_expert"]`` = [steps][E]: one heat map per run, experts as rows,
    steps as columns, colour = the expert's share of the token copies times E (1 = its fair
    share), so no two experts need telling apart by hue."""
    import numpy as np
    fig, axes = new(5.0, 2.9, ncols=len(runs), sharey=True)
    axes = list(axes) if len(runs) > 1 else [axes]
    image = None
    for ax, (label, run) in zip(axes, runs.items()):
        counts = np.array(run["tokens_per_expert"], dtype=float)          # [steps, E]
        share = counts / counts.sum(1, keepdims=True) * counts.shape[1]   # 1 = fair share
        steps = np.arange(share.shape[0] + 1) + 0.5
        experts = np.arange(share.shape[1] + 1) - 0.5
        image = ax.pcolormesh(steps, experts, share.T, cmap="magma_r", vmin=0, vmax=4)  # vector
        ax.set_ylim(share.shape[1] - 0.5, -0.5)
        ax.set_title(label, loc="left")
        ax.set_xlabel("step")
        ax.set_yticks(range(share.shape[1]), [f"e{e}" for e in range(share.shape[1])])
    bar = fig.colorbar(image, ax=axes, fraction=0.05, pad=0.03)
    bar.solids.set_rasterized(False)           # matplotlib rasterizes long colorbars: keep vector
    bar.set_label("share x E")
    return fig


def fig_drops(rows: list):
    """``rows`` from ``drop_sweep``: measured dropped fraction and the balanced-router prediction."""
    fig, ax = new(5.0, 2.7)
    f = [r["capacity_factor"] for r in rows]
    ax.plot(f, [r["dropped"] for r in rows], "o-", label="measured (labkit.moe, one device)")
    ax.plot(f, [r["balanced_prediction"] for r in rows], "s--", label="balanced: max(0, 1 - factor)")
    ax.set_xlabel("moe_expert_capacity_factor")
    ax.set_ylabel("dropped token copies")
    ax.legend(frameon=False)
    fig.tight_layout()
    return fig


def fig_expert_grid(topo=None, gpus_per_node: int = 8):
    """The same 8 ranks on the dense grid (tp, dp) and on the expert grid (ep, edp), default
    TP 2 with EP 4 and ETP 1 (MoE parallel folding: ep spans ranks that are tp in attention)."""
    from ..topology import Topology
    topo = topo or Topology(8, tp=2, ep=4, etp=1)
    axes_ = ("tp", "dp", "ep", "edp")
    fig, axs = new(5.0, 1.05 * len(axes_) + 0.2, nrows=len(axes_))
    for ax, axis in zip(axs, axes_):
        draw_groups(ax, topo, axis, gpus_per_node, show_nodes=ax is axs[-1])
    fig.tight_layout(h_pad=0.3)
    return fig

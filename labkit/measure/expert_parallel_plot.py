"""Figures of the Expert-parallelism chapter, drawn from labkit's own code and measurements.

``plot_dispatch``: the all-to-all dispatch of a real routing (labkit.moe.permute and the split
sizes of expert_parallel/dispatch.py) on two ranks: tokens, permutation by expert, all-to-all,
the experts, and the way back. ``plot_load_balance``: tokens per expert per step over training.
``plot_drops``: the dropped fraction against the capacity factor, measured and predicted.
"""
from __future__ import annotations

COLORS = ["#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b2", "#937860", "#da8bc3", "#8c8c8c"]


def dispatch_layout(routing_maps, num_experts: int):
    """Per rank, the rows of each stage of the all-to-all dispatch: [(token, source rank, expert)].

    ``routing_maps[r]`` [T, E] bool of rank r; experts split evenly over the ranks."""
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
    return stages


def plot_dispatch(routing_maps, num_experts: int, ax=None):
    """Draw :func:`dispatch_layout`: one box per row, coloured by expert, labelled
    "token@source rank"; the way back is the same figure read right to left."""
    import matplotlib.pyplot as plt
    stages = dispatch_layout(routing_maps, num_experts)
    n, T = len(routing_maps), routing_maps[0].shape[0]
    rows = max(len(s) for st in stages.values() for s in st)
    if ax is None:
        _, ax = plt.subplots(figsize=(11, 1.0 + 0.28 * rows * n))
    titles = ["tokens (rank order)", "permutation 1:\nsorted by expert", "all-to-all:\n[source][expert]",
              "permutation 2:\nby local expert -> experts"]
    for col, (name, per_rank) in enumerate(stages.items()):
        for r, seq in enumerate(per_rank):
            y0 = (n - 1 - r) * (rows + 2)
            for i, (t, src, e) in enumerate(seq):
                y = y0 + rows - 1 - i
                ax.add_patch(plt.Rectangle((col * 3, y), 2.2, 0.85, color=COLORS[e % len(COLORS)],
                                           alpha=0.9 if src == r or col == 0 else 0.55))
                ax.text(col * 3 + 1.1, y + 0.42, f"t{t}@r{src}  e{e}", ha="center", va="center",
                        fontsize=6.5, color="white")
            if col == 0:
                ax.text(-0.4, y0 + rows / 2, f"rank {r}\nexperts {r * num_experts // n}-"
                        f"{(r + 1) * num_experts // n - 1}", ha="right", va="center", fontsize=8)
        ax.text(col * 3 + 1.1, n * (rows + 2) - 1.2, titles[col], ha="center", va="bottom", fontsize=8)
    for col in range(3):
        ax.annotate("", xy=(col * 3 + 2.9, n * (rows + 2) / 2 - 1), xytext=(col * 3 + 2.3, n * (rows + 2) / 2 - 1),
                    arrowprops=dict(arrowstyle="->"))
    ax.set_xlim(-3.2, 12)
    ax.set_ylim(-0.5, n * (rows + 2) + 0.8)
    ax.axis("off")
    ax.set_title(f"{n} ranks, {T} tokens each, top-1 of {num_experts} experts; back: all-to-all with the "
                 "splits swapped, then the inverse permutation weighted by the router", fontsize=8)
    return ax


def plot_load_balance(runs: dict, ax=None):
    """``runs[label]["tokens_per_expert"]`` = [steps][E]: each expert's share of the token copies."""
    import matplotlib.pyplot as plt
    if ax is None:
        _, ax = plt.subplots(1, len(runs), figsize=(11, 3.2), sharey=True)
    for a, (label, run) in zip(ax, runs.items()):
        share = [[c / sum(step) for c in step] for step in run["tokens_per_expert"]]
        E = len(share[0])
        for e in range(E):
            a.plot(range(1, len(share) + 1), [s[e] for s in share], color=COLORS[e % len(COLORS)], lw=1.2,
                   label=f"expert {e}")
        a.axhline(1 / E, color="black", ls=":", lw=1)
        a.set_title(label, fontsize=9)
        a.set_xlabel("step")
    ax[0].set_ylabel("share of token copies (layer 0)")
    ax[-1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return ax


def plot_drops(rows: list, ax=None):
    """``rows`` from ``drop_sweep``: measured dropped fraction and the balanced-router prediction."""
    import matplotlib.pyplot as plt
    ax = ax or plt.subplots(figsize=(5.5, 3.2))[1]
    f = [r["capacity_factor"] for r in rows]
    ax.plot(f, [r["dropped"] for r in rows], "o-", label="measured (one device, labkit.moe)")
    ax.plot(f, [r["balanced_prediction"] for r in rows], "s--", label="balanced router: max(0, 1 - factor)")
    ax.set_xlabel("moe_expert_capacity_factor")
    ax.set_ylabel("dropped fraction of token copies")
    ax.legend(fontsize=8)
    return ax

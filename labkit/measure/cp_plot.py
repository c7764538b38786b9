"""Figures of the chapter "Context parallelism": the ring's steps, the causal split, the work per rank.

Pure drawing (matplotlib) from ``context_parallel.sharding`` (which chunks each rank holds and
which blocks causal attention computes) and from measured results (``context_parallel.work_balance``).
"""
from __future__ import annotations

from ..context_parallel.sharding import chunk_ids, pair_kind

COLORS = ["#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860", "#DA8BC3", "#8C8C8C"]


def plot_ring(cp: int = 4, layout: str = "balanced", ax=None):
    """Ranks x steps of the forward ring: the K/V block each rank holds at each step (its owner
    and chunks) and how many of the 4 (query chunk, key chunk) blocks causal attention computes."""
    import matplotlib.pyplot as plt
    if ax is None:
        _, ax = plt.subplots(figsize=(1.9 * cp + 1.5, 0.75 * cp + 1.0))
    for r in range(cp):
        for step in range(cp):
            src = (r - step) % cp
            kinds = [pair_kind(a, b) for a in chunk_ids(r, cp, layout) for b in chunk_ids(src, cp, layout)]
            n = sum(k is not None for k in kinds)
            ax.add_patch(plt.Rectangle((step, cp - 1 - r), 0.94, 0.9, color=COLORS[src % len(COLORS)],
                                       alpha=0.25 + 0.75 * n / 4))
            ax.text(step + 0.47, cp - 0.55 - r, f"K/V of {src}\nchunks {chunk_ids(src, cp, layout)}\n{n}/4 blocks",
                    ha="center", va="center", fontsize=7)
    ax.set_xlim(0, cp)
    ax.set_ylim(0, cp)
    ax.set_xticks([s + 0.47 for s in range(cp)], [f"step {s}" for s in range(cp)])
    ax.set_yticks([cp - 0.55 - r for r in range(cp)],
                  [f"rank {r}: q chunks {chunk_ids(r, cp, layout)}" for r in range(cp)])
    ax.set_title(f"ring attention forward, CP {cp}, {layout} split: send to r+1, receive from r-1",
                 fontsize=9)
    for side in ("top", "right", "bottom", "left"):
        ax.spines[side].set_visible(False)
    return ax


def plot_causal_split(cp: int = 4, axes=None):
    """The causal attention matrix in 2c x 2c chunk blocks, each computed block colored by the rank
    that owns its queries (a diagonal block is half the work): contiguous vs balanced."""
    import matplotlib.pyplot as plt
    if axes is None:
        _, axes = plt.subplots(1, 2, figsize=(8, 4))
    n = 2 * cp
    for ax, layout in zip(axes, ("contiguous", "balanced")):
        owner = {c: r for r in range(cp) for c in chunk_ids(r, cp, layout)}
        for a in range(n):
            for b in range(n):
                kind = pair_kind(a, b)
                if kind is None:
                    continue
                color = COLORS[owner[a] % len(COLORS)]
                if kind == "full":
                    ax.add_patch(plt.Rectangle((b, n - 1 - a), 1, 1, color=color))
                else:                                       # lower triangle of the diagonal block
                    ax.add_patch(plt.Polygon([(b, n - 1 - a), (b + 1, n - 1 - a), (b, n - a)], color=color))
        ax.set_xlim(0, n)
        ax.set_ylim(0, n)
        ax.set_aspect("equal")
        ax.set_xticks([i + 0.5 for i in range(n)], range(n), fontsize=7)
        ax.set_yticks([n - 0.5 - i for i in range(n)], range(n), fontsize=7)
        ax.set_xlabel("key chunk")
        ax.set_ylabel("query chunk")
        work = [sum((1.0 if pair_kind(a, b) == "full" else 0.5) for a in chunk_ids(r, cp, layout)
                    for b in range(n) if pair_kind(a, b)) for r in range(cp)]
        ax.set_title(f"{layout}: chunk blocks per rank: {', '.join(f'{w:g}' for w in work)}", fontsize=9)
    handles = [plt.Rectangle((0, 0), 1, 1, color=COLORS[r]) for r in range(cp)]
    axes[1].legend(handles, [f"rank {r}" for r in range(cp)], fontsize=7, loc="upper right")
    return axes


def plot_balance(balance: dict, axes=None):
    """Bars per rank of ``work_balance``'s result: FLOPs counted and host seconds, per layout."""
    import matplotlib.pyplot as plt
    if axes is None:
        _, axes = plt.subplots(1, 2, figsize=(9, 3))
    layouts = list(balance)
    cp = len(balance[layouts[0]])
    width = 0.8 / len(layouts)
    for i, layout in enumerate(layouts):
        xs = [r + (i - (len(layouts) - 1) / 2) * width for r in range(cp)]
        axes[0].bar(xs, [x["flops"] / 1e9 for x in balance[layout]], width, label=layout)
        axes[1].bar(xs, [x["seconds"] * 1e3 for x in balance[layout]], width, label=layout)
    for ax, what in zip(axes, ("attention GFLOP (counted)", "attention time (ms, host)")):
        ax.set_xticks(range(cp), [f"rank {r}" for r in range(cp)])
        ax.set_ylabel(what)
        ax.legend(fontsize=8)
    axes[0].set_title("ring attention, forward + backward, per rank", fontsize=9)
    return axes

"""Figures of the chapter "Context parallelism", drawn from ``context_parallel.sharding`` (which
chunks each rank holds, which blocks causal attention computes), from measured results
(``measure.context_parallel.work_balance``) and from the gpt2-xl table next to labkit.calc
(``measure.cp_table.compare``).

    fig_cp_ring(cp, layout)      ranks x ring steps: whose K/V each rank holds, blocks computed
    fig_causal_split(cp)         the causal attention matrix in 2c x 2c chunk blocks, by owner
    fig_balance(balance)         attention FLOPs per rank, contiguous vs balanced (counted)
    fig_cp_table(table)          gpt2-xl on H100: memory per GPU against tokens per GPU
"""
from __future__ import annotations

from ..context_parallel.sharding import chunk_ids, pair_kind
from .style import new

COLORS = ["#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860", "#da8bc3", "#8c8c8c"]


def _work(cp: int, layout: str) -> list[float]:
    """Chunk blocks each rank computes (a diagonal block is half a block)."""
    n = 2 * cp
    return [sum(1.0 if pair_kind(a, b) == "full" else 0.5 for a in chunk_ids(r, cp, layout)
                for b in range(n) if pair_kind(a, b)) for r in range(cp)]


def fig_cp_ring(cp: int = 4, layout: str = "balanced"):
    """Row r, column i: the K/V block rank r holds at ring step i (rank (r - i) mod c's), in that
    rank's colour, darker the more of its 4 (query chunk, key chunk) blocks causal attention needs."""
    from matplotlib.patches import Rectangle
    fig, ax = new(5.0, 0.55 * cp + 0.9)
    for r in range(cp):
        for step in range(cp):
            src = (r - step) % cp
            kinds = [pair_kind(a, b) for a in chunk_ids(r, cp, layout) for b in chunk_ids(src, cp, layout)]
            n = sum(k is not None for k in kinds)
            ax.add_patch(Rectangle((step, r), 0.95, 0.9, color=COLORS[src % len(COLORS)],
                                   alpha=0.2 + 0.8 * n / 4))
            ax.text(step + 0.475, r + 0.45, f"K/V {src}: {n}/4", ha="center", va="center",
                    color="white" if n >= 3 else "black")
    ax.set_xlim(0, cp)
    ax.set_ylim(cp, -0.05)
    ax.set_xticks([s + 0.475 for s in range(cp)], [f"step {s}" for s in range(cp)])
    ax.xaxis.tick_top()
    ax.set_yticks([r + 0.45 for r in range(cp)],
                  [f"rank {r}, q {chunk_ids(r, cp, layout)}" for r in range(cp)])
    ax.tick_params(length=0)
    for side in ("top", "right", "bottom", "left"):
        ax.spines[side].set_visible(False)
    fig.tight_layout()
    return fig


def fig_causal_split(cp: int = 4):
    """Contiguous (left) and balanced (right) splits of the causal attention matrix into 2c chunk
    blocks; each block computed is coloured by the rank owning its queries."""
    from matplotlib.patches import Polygon, Rectangle
    fig, axes = new(5.0, 3.0, ncols=2)
    n = 2 * cp
    for ax, layout in zip(axes, ("contiguous", "balanced")):
        owner = {c: r for r in range(cp) for c in chunk_ids(r, cp, layout)}
        for a in range(n):
            for b in range(n):
                kind = pair_kind(a, b)
                if kind == "full":
                    ax.add_patch(Rectangle((b, a), 1, 1, color=COLORS[owner[a]], ec="white", lw=0.5))
                elif kind == "diag":                    # causal inside: lower triangle
                    ax.add_patch(Polygon([(b, a), (b, a + 1), (b + 1, a + 1)], color=COLORS[owner[a]]))
        ax.set_xlim(0, n)
        ax.set_ylim(n, 0)
        ax.set_aspect("equal")
        ticks = list(range(0, n, 2))
        ax.set_xticks([i + 0.5 for i in ticks], ticks)
        ax.set_yticks([i + 0.5 for i in ticks], ticks)
        ax.set_xlabel("key chunk")
        ax.set_title(f"{layout}\nblocks: {', '.join(f'{w:g}' for w in _work(cp, layout))}",
                     loc="left")
    axes[0].set_ylabel("query chunk")
    handles = [Rectangle((0, 0), 1, 1, color=COLORS[r]) for r in range(cp)]
    fig.legend(handles, [f"rank {r}" for r in range(cp)], ncol=cp, frameon=False,
               loc="lower center", bbox_to_anchor=(0.5, -0.04), handlelength=1.2)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    return fig


def fig_balance(balance: dict):
    """``balance[layout]`` = per rank {"flops", ...} (``work_balance``): GFLOP per rank."""
    fig, ax = new(5.0, 2.5)
    layouts = list(balance)
    cp = len(balance[layouts[0]])
    width = 0.8 / len(layouts)
    for i, (layout, color) in enumerate(zip(layouts, ("#999999", "#4c72b0"))):
        xs = [r + (i - (len(layouts) - 1) / 2) * width for r in range(cp)]
        ax.bar(xs, [x["flops"] / 1e9 for x in balance[layout]], width, label=layout, color=color)
    ax.set_xticks(range(cp), [f"rank {r}" for r in range(cp)])
    ax.set_ylabel("attention GFLOP")
    ax.legend(frameon=False, loc="upper left")
    fig.tight_layout()
    return fig


def fig_cp_table(table, capacity_gb: float = 80 * 2 ** 30 / 1e9):
    """Memory per GPU (GB) against tokens per GPU: measured runs, labkit.calc's prediction, the
    runs that ran out of memory, and the card's capacity."""
    fig, ax = new(5.0, 2.9)
    ran = table[~table["ran out"]]
    oom = table[table["ran out"]]
    ax.plot(table["tokens/GPU"], table["calc GB"], "x", color="#4c72b0", ms=8, label="labkit.calc")
    ax.plot(ran["tokens/GPU"], ran["measured GB"], "o", color="black", label="measured")
    ax.plot(oom["tokens/GPU"], [capacity_gb * 1.04] * len(oom), "v", color="#c44e52", ms=8,
            label="ran out of memory")
    ax.axhline(capacity_gb, color="grey", ls=":", lw=1)
    ax.text(table["tokens/GPU"].min(), capacity_gb - 2, "80 GiB", va="top")
    labels: dict = {}                          # runs at about the same point share one label
    for _, r in table.iterrows():
        y = capacity_gb * 1.04 if r["ran out"] else r["measured GB"]
        key = (r["tokens/GPU"], round(y / 8))
        x0, ys, names = labels.get(key, (r["tokens/GPU"], [], []))
        labels[key] = (x0, ys + [y], names + [r["row"]])
    for x0, ys, names in labels.values():
        ax.text(x0 * 1.07, sum(ys) / len(ys), ", ".join(names), va="center")
    ax.set_xscale("log", base=2)
    ticks = sorted(set(table["tokens/GPU"]))
    ax.set_xticks(ticks, [f"{t // 1024}K" for t in ticks])
    ax.minorticks_off()
    ax.set_xlabel("tokens per GPU (batch x seq / CP)")
    ax.set_ylabel("GB per GPU")
    ax.set_ylim(0, capacity_gb * 1.15)
    ax.legend(frameon=False, loc="lower right")
    fig.tight_layout()
    return fig

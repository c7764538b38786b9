"""Figures of the chapter "Collectives", drawn from tensors the ranks really held and from
labkit.calc.comm.

    fig_collectives(per_rank)     each collective: every rank's tensor before and after
    fig_ring_steps(states)        a ring all-reduce, step by step (reduce-scatter, then all-gather)
    fig_ring_bytes()              bytes each rank sends against the number of ranks
    fig_alpha_beta(links)         ring all-reduce time against size, alpha-beta model
    fig_cluster_times(rows)       TP and DP communication per step next to the compute

Colours say where a value came from: every op also ran on a *tag* tensor holding 2**r on rank
r, so a sum of distinct powers of two names the ranks that contributed (one rank: its colour;
several: the mix of theirs, paler; all of them: grey).
"""
from __future__ import annotations

from .style import new

RANK_COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f")


def tag_color(tag: float, world: int):
    """An element's colour from its tag: its rank's, a mix of the contributors', grey for all."""
    from matplotlib.colors import to_rgb
    ranks = [r for r in range(world) if int(tag) >> r & 1]
    if len(ranks) == world:
        return (0.78, 0.78, 0.78)
    rgb = [sum(to_rgb(RANK_COLORS[r])[i] for r in ranks) / len(ranks) for i in range(3)]
    light = 0.35 if len(ranks) == 1 else 0.5          # partial sums: paler than one rank's value
    return tuple(light + (1 - light) * c for c in rgb)


def draw_table(ax, rows, tags, x0: float = 0.0, title: str = "", outline=(), labels=True):
    """Rank r's values as row r of boxes from x = ``x0``; ``outline``: (rank, column) to frame."""
    from matplotlib.patches import Rectangle
    world = len(rows)
    for r, (vals, tg) in enumerate(zip(rows, tags)):
        for j, (v, t) in enumerate(zip(list(vals), list(tg))):
            framed = (r, j) in outline
            ax.add_patch(Rectangle((x0 + j, r), 1, 1, fc=tag_color(float(t), world), ec="black",
                                   lw=2.2 if framed else 0.5, zorder=3 if framed else 2))
            if labels:
                ax.text(x0 + j + 0.5, r + 0.5, f"{float(v):g}", ha="center", va="center")
    if title:
        ax.text(x0, -0.25, title, ha="left", va="bottom")


def _table_axes(ax, world: int, width: float, top: float = -1.2):
    ax.set_xlim(-0.1, width)
    ax.set_ylim(world + 0.1, top)
    ax.set_aspect("equal")
    ax.axis("off")


def fig_collectives(per_rank: list):
    """``per_rank[r][op] = (x, tag, x_after, tag_after)`` as the chapter's launch returns it."""
    ops = list(per_rank[0])
    world = len(per_rank)
    fig, axes = new(5.0, 1.55 * ((len(ops) + 1) // 2) + 0.3, nrows=(len(ops) + 1) // 2, ncols=2)
    widest = max(len(per_rank[r][op][k]) for r in range(world) for op in ops for k in (0, 2))
    for ax, op in zip(axes.flat, ops):
        x, tag, y, ytag = zip(*(per_rank[r][op] for r in range(world)))
        w_in, w_out = max(len(v) for v in x), max(len(v) for v in y)
        draw_table(ax, x, tag)
        draw_table(ax, y, ytag, x0=w_in + 1.2)
        ax.annotate("", xy=(w_in + 1.1, world / 2), xytext=(w_in + 0.1, world / 2),
                    arrowprops=dict(arrowstyle="->", lw=1.2))
        ax.text(0, -0.3, op.replace("_", "-"), ha="left", va="bottom", fontweight="bold")
        _table_axes(ax, world, 2 * widest + 1.2)
    for ax in axes.flat[len(ops):]:
        ax.axis("off")
    for r in range(world):
        axes.flat[0].text(-0.2, r + 0.5, f"r{r}", ha="right", va="center")
    fig.tight_layout(h_pad=0.4, w_pad=1.0)
    return fig


def fig_ring_steps(states: list):
    """``states[r][step] = (values, tags, chunk received or None)``: the ring all-reduce of the
    chapter, start + n-1 reduce-scatter steps + n-1 all-gather steps."""
    world = len(states)
    n_steps = len(states[0])
    titles = ["start"] + [f"RS {k + 1}" for k in range(world - 1)] + [f"AG {k + 1}" for k in range(world - 1)]
    per_row = world                      # start + RS steps on row 1, AG steps on row 2
    fig, axes = new(5.0, 3.3, nrows=2, ncols=per_row)
    for step in range(n_steps):
        ax = axes.flat[step if step < per_row else per_row + step - per_row + 1]
        rows, tags, got = zip(*(states[r][step] for r in range(world)))
        outline = {(r, got[r]) for r in range(world)} if step else set()
        draw_table(ax, rows, tags, outline=outline)
        ax.text(0, -0.2, titles[step], ha="left", va="bottom")
        _table_axes(ax, world, world + 0.1, top=-1.3)
    axes.flat[per_row].axis("off")
    axes.flat[per_row].text(0.5, 0.5, "all-gather\nphase:\ncopy what\narrives", ha="center",
                            va="center", transform=axes.flat[per_row].transAxes)
    for r in range(world):
        axes.flat[0].text(-0.2, r + 0.5, f"r{r}", ha="right", va="center")
    fig.tight_layout(h_pad=0.2, w_pad=0.3)
    return fig


def fig_ring_bytes(max_ranks: int = 64):
    """Bytes one rank sends per byte of the tensor, ring vs everyone-to-everyone (labkit.calc)."""
    from ..calc import comm
    ns = list(range(2, max_ranks + 1))
    fig, ax = new(5.0, 2.7)
    ax.plot(ns, [comm.ring_all_reduce_bytes(1.0, n) for n in ns], label="ring all-reduce: 2(n-1)/n")
    ax.plot(ns, [comm.all_gather_bytes(1.0, n) for n in ns],
            label="all-gather, reduce-scatter: (n-1)/n")
    ax.plot(ns, [n - 1 for n in ns], "--", label="everyone sends to everyone: n-1")
    ax.set_yscale("log")
    ax.set_yticks([0.5, 1, 2, 10, 60], ["0.5", "1", "2", "10", "60"])
    ax.minorticks_off()
    ax.set_xlabel("ranks n")
    ax.set_ylabel("bytes sent per rank / N")
    ax.legend(frameon=False, loc="center right")
    fig.tight_layout()
    return fig


LINKS = {   # (bandwidth per GPU per direction in bytes/s, assumed latency alpha in s)
    "NVLink 3 (300 GB/s)": (300e9, 5e-6),
    "NVLink 2 (150 GB/s)": (150e9, 5e-6),
    "IB HDR (25 GB/s)": (200e9 / 8, 10e-6),
}


def fig_alpha_beta(links: dict | None = None, n: int = 8):
    """Ring all-reduce time over ``n`` ranks against the tensor size (labkit.calc.comm), one line
    per link, a dot where the latency term equals the bandwidth term (N* = n alpha beta)."""
    from ..calc import comm
    links = links or LINKS
    sizes = [10 ** (3 + 7 * i / 199) for i in range(200)]      # 1 KB ... 10 GB
    fig, ax = new(5.0, 2.9)
    for label, (beta, alpha) in links.items():
        t = [comm.collective_time("all_reduce", s, n, beta, alpha) for s in sizes]
        line, = ax.loglog(sizes, t, label=label)
        n_star = n * alpha * beta
        ax.plot([n_star], [comm.collective_time("all_reduce", n_star, n, beta, alpha)], "o",
                color=line.get_color())
    ax.set_xticks([1e3, 1e6, 1e9], ["1 KB", "1 MB", "1 GB"])
    ax.set_yticks([1e-4, 1e-2, 1], ["0.1 ms", "10 ms", "1 s"])
    ax.minorticks_off()
    ax.set_xlabel("tensor size N (bytes)")
    ax.set_ylabel(f"all-reduce, {n} ranks")
    ax.legend(frameon=False, title="dots: N* = n alpha beta")
    fig.tight_layout()
    return fig


def fig_cluster_times(rows: list):
    """Per cluster, seconds per step per GPU: TP's bytes on NVLink and on the node's network,
    DP's on the network, and the compute (``rows`` as the chapter's table builds them)."""
    import numpy as np
    bars = (("TP on NVLink s", "TP on NVLink", "#2ca02c"), ("TP on IB s", "TP across nodes", "#d62728"),
            ("DP on IB s", "DP across nodes", "#1f77b4"), ("compute s", "compute (50% of peak)", "#7f7f7f"))
    fig, ax = new(5.0, 0.9 * len(rows) + 1.6)
    y = np.arange(len(rows))
    h = 0.8 / len(bars)
    for i, (key, label, color) in enumerate(bars):
        vals = [row[key] for row in rows]
        ax.barh(y + (i - 1.5) * h, vals, h, color=color, label=label)
        for yy, v in zip(y, vals):
            ax.text(v + 0.4, yy + (i - 1.5) * h, f"{v:g}", va="center")
    ax.set_yticks(y, [row["cluster"].split(",")[0].split(" (")[0] for row in rows])
    ax.set_ylim(len(rows) - 0.5, -0.5)
    ax.set_xlabel("seconds per step, per GPU")
    ax.set_xlim(0, max(row[k] for row in rows for k, _, _ in bars) * 1.18)
    ax.legend(frameon=False, loc="upper center", bbox_to_anchor=(0.45, -0.2), ncol=2)
    fig.tight_layout()
    return fig

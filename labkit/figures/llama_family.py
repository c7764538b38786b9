"""Figures of the chapter "The Llama family under every axis", drawn from labkit's own objects: the
shard plan's cuts (``labkit.shard_plan``: ``stacked`` for SwiGLU's fc1, ``qkv`` for group-query
attention) and context parallelism's token placement (``context_parallel.sharding.positions``).
Each function returns a matplotlib Figure in the house style (``labkit.figures.new``).
"""
from __future__ import annotations

from .. import shard_plan as sp
from ..context_parallel.sharding import positions
from .style import SMALL_PT, new

RANK_COLOURS = ["#1f5fa8", "#e07b00", "#2e7d32", "#8e24aa"]


def _rank_of_rows(n: int, t: int, blocks_of) -> list[int]:
    """Owner rank of each of ``n`` dense rows, from ``blocks_of(rank)`` of t ranks (owned blocks)."""
    owner = [-1] * n
    for r in range(t):
        for b in blocks_of(r):
            if b.owner:
                owner[b.start:b.stop] = [r] * b.size
    return owner


def swiglu_cut(ffn: int = 4, t: int = 2):
    """fc1 = [gate; up] ([2 ffn, h]) cut over t ranks: the plan's [gate_r; up_r] (left) and a
    contiguous cut (right), each row coloured by the rank that holds it."""
    import matplotlib.patches as mp
    fig, axes = new(5.0, 3.2, 1, 2)
    cuts = {"labkit / Megatron:\n[gate_r; up_r]": lambda r: sp.stacked(2 * ffn, 2, t, r),
            "contiguous cut\n(the trap)": lambda r: sp.contiguous(2 * ffn, t, r)}
    for ax, (title, blocks_of) in zip(axes, cuts.items()):
        for i, r in enumerate(_rank_of_rows(2 * ffn, t, blocks_of)):
            ax.add_patch(mp.Rectangle((0, i), 1, 1, facecolor=RANK_COLOURS[r], edgecolor="white"))
            ax.text(0.5, i + 0.5, f"rank {r}", ha="center", va="center", color="white", fontsize=SMALL_PT)
        for i, part in enumerate(("gate", "up")):
            ax.text(-0.08, (i + 0.5) * ffn, part, ha="right", va="center", fontsize=SMALL_PT)
        ax.axhline(ffn, color="black", lw=1.5)
        ax.set_xlim(-0.6, 1.05)
        ax.set_ylim(2 * ffn, 0)
        ax.set_title(title, fontsize=SMALL_PT)
        ax.axis("off")
    fig.text(0.5, 0.02, f"rows of fc1 = [gate; up], ffn = {ffn} each, t = {t}", ha="center", fontsize=SMALL_PT)
    return fig


def gqa_on_tp(heads: int = 8, groups: int = 2, tps=(2, 4)):
    """Query heads and K/V groups on the tensor-parallel ranks, from ``shard_plan.qkv``: with t = g
    each rank holds one whole group; with t > g the t/g ranks of a group each hold part of its
    query heads and a copy of its K and V (hatched: summed over those ranks)."""
    import matplotlib.patches as mp
    fig, axes = new(5.0, 1.0 + 0.55 * sum(tps), len(tps), 1,
                    gridspec_kw={"height_ratios": list(tps)})
    per = heads // groups + 2                                   # rows per group, head_dim 1
    for ax, t in zip(axes, tps):
        for r in range(t):
            x = 0.0
            for b in sp.qkv(heads, groups, 1, t, r):
                for row in range(b.start, b.stop):
                    g, k = divmod(row, per)
                    label = f"q{g * (per - 2) + k}" if k < per - 2 else ("K" if k == per - 2 else "V") + str(g)
                    ax.add_patch(mp.Rectangle((x, r), 0.95, 0.85, facecolor=RANK_COLOURS[g % 4],
                                              alpha=1.0 if k < per - 2 else 0.55,
                                              hatch="//" if b.sums else None, edgecolor="white"))
                    ax.text(x + 0.47, r + 0.42, label, ha="center", va="center", fontsize=SMALL_PT,
                            color="white" if k < per - 2 else "black")
                    x += 1
        ax.set_xlim(0, heads // min(tps) + 2)
        ax.set_ylim(t, 0)
        ax.set_yticks([r + 0.42 for r in range(t)], [f"tp rank {r}" for r in range(t)])
        ax.set_xticks([])
        ax.spines[["left", "bottom"]].set_visible(False)
        ax.tick_params(left=False)
        note = "one group per rank" if t <= groups else f"K/V shared by {t // groups} ranks (summed)"
        ax.set_title(f"t = {t}: {note}", fontsize=SMALL_PT, loc="left")
    return fig


def rope_positions_cp(seq_length: int = 16, cp: int = 2):
    """The global position of each token a context-parallel rank holds (load-balanced chunks r and
    2c-1-r), against its index on the rank: RoPE rotates by the global position (the plan's
    ``position_ids``); rotating by the local index would be the dashed line."""
    fig, ax = new(5.0, 3.0)
    n = seq_length // cp
    for r in range(cp):
        pos = positions(seq_length, r, cp)
        ax.plot(range(n), pos, "o-", color=RANK_COLOURS[r], ms=4, label=f"cp rank {r}")
    ax.plot(range(n), range(n), "--", color="grey", lw=1, label="local index (wrong)")
    ax.set_xlabel("token index on the rank")
    ax.set_ylabel("position RoPE rotates by")
    ax.set_yticks(range(0, seq_length + 1, seq_length // 4))
    ax.legend(frameon=False, fontsize=SMALL_PT)
    return fig

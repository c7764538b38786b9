"""The landing page's picture of the parallelism axes: what each one cuts (book/intro.md).

:func:`fig_axes` draws the ranks of one :class:`labkit.topology.Topology` (16 GPUs on two nodes of
8, TP 2, CP 2, PP 2, EP 2, so DP 2) once per axis, each rank coloured by its group on that axis
(``Topology.groups``): the ranks of a group share one colour and together hold one copy of what
the axis cuts.
"""
from __future__ import annotations

from ..topology import Topology
from .style import new

AXES = (("tp", "TP cuts each weight matrix", "(Shoeybi et al. 2019)"),
        ("cp", "CP cuts the sequence", "(Liu et al. 2023)"),
        ("dp", "DP cuts the batch", "(ZeRO: also the states)"),
        ("pp", "PP cuts the stack of layers", "(Huang et al. 2019)"),
        ("ep", "EP cuts the set of experts", "(Lepikhin et al. 2021)"))
PALETTE = ("#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860", "#da8bc3", "#8c8c8c")


def fig_axes(world_size: int = 16, gpus_per_node: int = 8, tp: int = 2, cp: int = 2, pp: int = 2, ep: int = 2):
    """One row per axis: the ranks, two nodes, each rank coloured by its group on that axis."""
    topo = Topology(world_size, tp=tp, pp=pp, cp=cp, ep=ep)
    fig, axes = new(5.0, 4.6, nrows=len(AXES), ncols=1)
    for ax, (axis, what, cite) in zip(axes, AXES):
        groups = topo.groups(axis)
        colour = {r: PALETTE[i % len(PALETTE)] for i, g in enumerate(groups) for r in g}
        for r in range(world_size):
            x = r + (r // gpus_per_node) * 0.6          # a gap between nodes
            ax.add_patch(_box(x, colour[r]))
            ax.text(x + 0.45, 0.45, str(r), ha="center", va="center", color="white")
        for node in range(world_size // gpus_per_node):
            x0 = node * (gpus_per_node + 0.6) - 0.1
            ax.add_patch(_frame(x0, gpus_per_node + 0.1))
        ax.text(-0.1, 1.25, f"{what} {cite}: {len(groups)} groups of {len(groups[0])}", ha="left", va="bottom")
        ax.set_xlim(-0.3, world_size + 0.6 * (world_size // gpus_per_node))
        ax.set_ylim(-0.25, 2.0)
        ax.axis("off")
    fig.tight_layout(h_pad=0.1)
    return fig


def _box(x, colour):
    from matplotlib.patches import Rectangle
    return Rectangle((x, 0), 0.9, 0.9, facecolor=colour, edgecolor="none")


def _frame(x, width):
    from matplotlib.patches import Rectangle
    return Rectangle((x, -0.15), width, 1.2, fill=False, edgecolor="#888", linestyle="--")

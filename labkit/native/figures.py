"""The chapter's figures, drawn from labkit's objects and from measured native runs (chapter "From
labkit to PyTorch-native"): the DeviceMesh of a Topology, FSDP2's collectives per unit in one
step, and torch's V-shaped schedules beside labkit's. House style: ``labkit.figures.style``.
"""
from __future__ import annotations

from ..figures.style import SMALL_PT, new
from ..topology import Topology
from .mesh import mesh_ranks

OPS = {"all_gather": ("#1f5fa8", "all-gather"), "reduce_scatter": ("#2e7d32", "reduce-scatter"),
       "all_reduce": ("#b35900", "all-reduce")}


def mesh_figure(topo: Topology):
    """One panel per pipeline rank: its dp x tp plane of ranks, each box the rank and its mesh
    coordinates; a row is a tp group, a column a dp group, the same box in each panel a pp group."""
    mesh = mesh_ranks(topo)
    pp, dp, tp = topo.pp, topo.dp, topo.tp
    fig, axes = new(5.0, 0.9 * dp + 1.3, ncols=pp, squeeze=False)
    for k, ax in enumerate(axes[0]):
        for i in range(dp):
            for j in range(tp):
                ax.add_patch(_box(j, -i, "#dbe8f5" if i % 2 == 0 else "#f5e6d3"))
                ax.text(j + 0.45, -i + 0.5, f"rank {mesh[k][i][j]}", ha="center", va="center", fontsize=SMALL_PT)
                ax.text(j + 0.45, -i + 0.18, f"({k},{i},{j})", ha="center", va="center", fontsize=SMALL_PT,
                        color="#555555")
        ax.set_xlim(-0.1, tp)
        ax.set_ylim(-dp + 0.9, 1.45)
        ax.axis("off")
        ax.set_title(f'mesh["pp"] = {k}', fontsize=SMALL_PT + 0.5)
        ax.annotate("", xy=(tp - 0.15, 1.15), xytext=(0.0, 1.15), arrowprops=dict(arrowstyle="<->", lw=1))
        ax.text(tp / 2 - 0.05, 1.25, "tp group (a row)", ha="center", fontsize=SMALL_PT)
    left = axes[0][0]
    left.annotate("", xy=(-0.12, -dp + 1.0), xytext=(-0.12, 0.8), arrowprops=dict(arrowstyle="<->", lw=1),
                  annotation_clip=False)
    left.text(-0.25, 0.9 - dp / 2, "dp group (a column)", ha="right", va="center", rotation=90,
              fontsize=SMALL_PT)
    fig.subplots_adjust(wspace=0.25)
    return fig


def _box(x, y, colour):
    from matplotlib.patches import FancyBboxPatch
    return FancyBboxPatch((x, y), 0.9, 0.8, boxstyle="round,pad=0.02", facecolor=colour,
                          edgecolor="#333333", linewidth=0.8)


def unit_names(sequence, unit_bytes: dict, reshard: bool) -> list[str]:
    """Name each collective of an FSDP2 step by its unit, from FSDP2's order (forward: root, then
    the layers; backward: the root's output layer, the layers in reverse, each unit's
    reduce-scatter after its backward). ``unit_bytes``: {unit: bytes one collective of it sends};
    raises if a collective's size is not its unit's."""
    layers = sorted((u for u in unit_bytes if u != "root"), key=lambda u: int(u.split()[1]))
    ag_b = (["root"] + layers[::-1]) if reshard else []
    names, queues = [], {"all_gather": ["root"] + layers + ag_b, "reduce_scatter": layers[::-1] + ["root"]}
    for _, op, nbytes in sequence:
        name = queues[op].pop(0)
        if abs(nbytes - unit_bytes[name]) > 0.5:
            raise ValueError(f"{op} of {nbytes:.0f} B where FSDP2's order puts {name} ({unit_bytes[name]:.0f} B)")
        names.append(name)
    return names


def fsdp_figure(steps: dict, unit_bytes: dict):
    """One row per run ({label: (comm_sequence, reshard_after_forward)}): its collectives in the
    order issued, each box as wide as the bytes it sends, named by its unit."""
    fig, ax = new(5.0, 0.9 * len(steps) + 1.2)
    for row, (label, (seq, reshard)) in enumerate(steps.items()):
        names, x = unit_names(seq, unit_bytes, reshard), 0.0
        for (_, op, nbytes), name in zip(seq, names):
            w = nbytes / 1e3
            ax.barh(-row, w, left=x, height=0.6, color=OPS[op][0], edgecolor="white")
            ax.text(x + w / 2, -row, name.replace("layer ", "L").replace("root", "R"), ha="center",
                    va="center", color="white", fontsize=SMALL_PT)
            x += w
    ax.set_yticks([-r for r in range(len(steps))], list(steps))
    ax.set_ylabel("reshard_after_forward")
    ax.set_xlabel("kB sent by rank 0, in the order issued\n(R: root unit, L<i>: layer i)")
    ax.legend(handles=[_patch(OPS[op][0]) for op in ("all_gather", "reduce_scatter")],
              labels=[OPS[op][1] for op in ("all_gather", "reduce_scatter")], loc="lower center",
              bbox_to_anchor=(0.5, 1.0), ncol=2, frameon=False)
    ax.set_ylim(-len(steps) + 0.4, 0.5)
    return fig


def _patch(colour):
    from matplotlib.patches import Rectangle
    return Rectangle((0, 0), 1, 1, color=colour)


def schedules_figure(pp: int = 4, m: int = 8):
    """labkit's 1F1B and ZB-H1 above torch's ZBVZeroBubble and DualPipeV, on one clock (F = 1,
    B = I + W = 2 for the whole of a rank's layers), each titled with its bubble fraction."""
    from ..pipeline_parallel.schedules import one_f_one_b
    from ..pipeline_parallel.simulate import simulate
    from .timeline import labkit_zb_h1, schedule_timeline
    sims = [("labkit 1F1B", simulate(one_f_one_b(pp, m))), ("labkit ZB-H1", labkit_zb_h1(pp, m)),
            ("torch ZBVZeroBubble", schedule_timeline("ZBVZeroBubble", pp, m)),
            ("torch DualPipeV", schedule_timeline("DualPipeV", pp, m))]
    span = max(s.makespan for _, s in sims)
    fig, axes = new(5.0, 1.0 * len(sims) * (pp / 4) + 1.6, nrows=len(sims))
    shades = {"F": ("#1f5fa8", "#7fb0e0"), "B": ("#2e7d32", "#8fcf92"), "W": ("#616161", "#bdbdbd")}
    for ax, (title, sim) in zip(axes, sims):
        for e in sim.timeline:
            colour = shades[e.action.kind][min(e.action.chunk, 1)]
            ax.barh(e.rank, e.end - e.start, left=e.start, height=0.8, color=colour, edgecolor="white",
                    linewidth=0.4)
        ax.set_xlim(0, span)
        ax.set_ylim(pp - 0.5, -0.5)
        ax.set_yticks(range(pp), [f"r{r}" for r in range(pp)])
        ax.set_title(f"{title}: bubble {sim.bubble_fraction:.3f}", loc="left", fontsize=SMALL_PT + 0.5)
        ax.tick_params(axis="x", labelbottom=ax is axes[-1])
    axes[-1].set_xlabel("time (one forward of a rank's layers = 1)")
    labels = ["F: forward", "B: backward (input half if W split)", "W: weight grad", "lighter: 2nd stage"]
    handles = [_patch(shades["F"][0]), _patch(shades["B"][0]), _patch(shades["W"][0]), _patch(shades["F"][1])]
    fig.legend(handles, labels, loc="upper center", ncol=2, frameon=False, bbox_to_anchor=(0.5, 1.04))
    fig.subplots_adjust(hspace=0.7)
    return fig

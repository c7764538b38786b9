"""Figures of the chapter "Putting it together: PTD-P", drawn from ``Topology`` (Megatron's rank
order), ``labkit.calc.step_time`` and the chapter's composed run (bytes counted per group).

    fig_rank_grid(topo, axes)        the world's ranks on nodes, coloured by their group per axis
    fig_step_breakdown(model, ...)   predicted step time of t x p layouts, stacked by part
    fig_composed_bytes(rows)         bytes per group and op of a composed step, counted vs calc
    fig_strategy_memory(gpu, cpu)    memory against the one-GPU baseline, 2xH200 vs laptop
"""
from __future__ import annotations

from .style import new

GROUP_COLORS = ["#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860", "#da8bc3",
                "#8c8c8c", "#ccb974", "#64b5cd"]


def draw_groups(ax, topo, axis: str, gpus_per_node: int = 8, show_nodes: bool = False):
    """One row of the world's ranks, split into nodes of ``gpus_per_node``, each rank coloured by
    its group of ``axis`` (``topo.groups``) and labelled with its number."""
    from matplotlib.patches import Rectangle
    group_of = {r: i for i, g in enumerate(topo.groups(axis)) for r in g}
    n = topo.world_size
    for node in range((n + gpus_per_node - 1) // gpus_per_node):
        x0 = node * (gpus_per_node + 0.4)
        ax.add_patch(Rectangle((x0 - 0.1, -0.1), gpus_per_node + 0.2, 1.2, fc="none", ec="#777777",
                               lw=1, ls="--"))
        if show_nodes:
            ax.text(x0 + gpus_per_node / 2, 1.2, f"node {node}", ha="center", va="top", color="#555555")
    for r in range(n):
        x = (r // gpus_per_node) * (gpus_per_node + 0.4) + r % gpus_per_node
        ax.add_patch(Rectangle((x + 0.06, 0.06), 0.88, 0.88,
                               color=GROUP_COLORS[group_of[r] % len(GROUP_COLORS)]))
        ax.text(x + 0.5, 0.5, str(r), ha="center", va="center", color="white")
    groups = topo.groups(axis)
    shown = " ".join(str(g).replace(" ", "") for g in groups[:4]) + (" ..." if len(groups) > 4 else "")
    ax.text(0, -0.2, f"{axis}: {shown}", ha="left", va="bottom")
    nodes = (n + gpus_per_node - 1) // gpus_per_node
    ax.set_xlim(-0.15, nodes * (gpus_per_node + 0.4) - 0.25)
    ax.set_ylim(1.75, -0.85)
    ax.set_aspect("equal")
    ax.axis("off")


def fig_rank_grid(topo=None, axes=("tp", "dp", "pp"), gpus_per_node: int = 4):
    """One row per axis: which ranks form each group (default: 8 ranks, TP 2, PP 2, DP 2 on two
    nodes of 4 GPUs)."""
    from ..topology import Topology
    topo = topo or Topology(8, tp=2, pp=2)
    fig, axs = new(5.0, 1.05 * len(axes) + 0.2, nrows=len(axes))
    axs = list(axs) if len(axes) > 1 else [axs]
    for ax, axis in zip(axs, axes):
        draw_groups(ax, topo, axis, gpus_per_node, show_nodes=ax is axs[-1])
    fig.tight_layout(h_pad=0.3)
    return fig


PARTS = (("compute", "#7f7f7f"), ("bubble", "#ccb974"), ("tp_comm", "#c44e52"),
         ("pp_comm", "#55a868"), ("dp_comm", "#4c72b0"), ("optimizer", "#8172b3"), ("fixed", "#dddddd"))


def fig_step_breakdown(model=None, cluster=None, layouts=((1, 16), (2, 8), (4, 4), (8, 2), (16, 1)),
                       **par):
    """``labkit.calc.step_time`` of each (t, p) on the same world, stacked by part (the parts add
    up to the step time); the paper's 39B model on 64 DGX A100 nodes by default."""
    from .. import calc
    model = model or calc.model("megatron-39b")
    cluster = cluster or calc.cluster("dgx-a100", 64)
    par = par or dict(world_size=512, micro_batch_size=4, global_batch_size=1536,
                      recompute_granularity="full")
    fig, ax = new(5.0, 0.4 * len(layouts) + 1.4)
    for i, (tp, pp) in enumerate(layouts):
        t = calc.step_time(model, calc.ParallelConfig(tensor_model_parallel_size=tp,
                                                      pipeline_model_parallel_size=pp, **par), cluster)
        left = 0.0
        for part, color in PARTS:
            ax.barh(i, t[part], left=left, color=color, height=0.65, label=part if i == 0 else None)
            left += t[part]
        ax.text(left + 0.2, i, f"{t['step_time']:.1f} s", va="center")
    ax.set_yticks(range(len(layouts)), [f"t{tp} x p{pp}" for tp, pp in layouts])
    ax.set_ylim(len(layouts) - 0.5, -0.5)
    ax.set_xlabel("predicted seconds per step (labkit.calc)")
    ax.legend(frameon=False, ncol=4, loc="lower center", bbox_to_anchor=(0.4, 1.0),
              columnspacing=0.8, handlelength=1.2)
    fig.tight_layout()
    return fig


def fig_composed_bytes(rows: list, ranks=(0, 7)):
    """``rows`` of ``measure.ptdp.composed_run(...)["bytes"]``: KiB one step sends, per group
    and op, for ``ranks``; a dot where labkit.calc predicts it (they coincide when equal)."""
    import numpy as np
    keys = sorted({(r["group"], r["op"]) for r in rows if r["rank"] in ranks and r["counted"]},
                  key=lambda k: (("tp", "pp", "dp", "embd").index(k[0]), k[1]))  # not set order
    fig, ax = new(5.0, 0.3 * len(keys) + 1.2)
    y = np.arange(len(keys))
    h = 0.8 / len(ranks)
    for j, rank in enumerate(ranks):
        got = {(r["group"], r["op"]): r for r in rows if r["rank"] == rank}
        ys = y + (j - (len(ranks) - 1) / 2) * h
        ax.barh(ys, [got[k]["counted"] / 1024 if k in got else 0 for k in keys], h,
                color=GROUP_COLORS[j], label=f"rank {rank}, counted")
        ax.plot([got[k]["labkit.calc"] / 1024 if k in got else 0 for k in keys], ys, "|",
                color="black", ms=9, mew=2, label="labkit.calc" if j == 0 else None)
    ax.set_yticks(y, [f"{g}: {op.replace('_', '-')}" for g, op in keys])
    ax.set_ylim(len(keys) - 0.5, -0.5)
    ax.set_xlabel("KiB sent in one step")
    ax.legend(frameon=False, loc="lower center", bbox_to_anchor=(0.35, 1.0), ncol=3,
              columnspacing=0.8, handlelength=1.2)
    fig.tight_layout()
    return fig


def fig_strategy_memory(gpu: dict, cpu: dict):
    """``gpu[strategy]``/``cpu[strategy]``: per-rank memory as a fraction of the one-device
    baseline; bars per strategy and rank, 2xH200 (nvidia-smi) next to the laptop (counted)."""
    import numpy as np
    names = list(gpu)
    labels, g, c = [], [], []
    for n in names:
        for r, (gv, cv) in enumerate(zip(gpu[n], cpu[n])):
            labels.append(n if len(gpu[n]) == 1 else f"{n} r{r}")
            g.append(gv)
            c.append(cv)
    fig, ax = new(5.0, 0.32 * len(labels) + 1.2)
    y = np.arange(len(labels))
    ax.barh(y - 0.2, g, 0.4, color="#4c72b0", label="2xH200, nvidia-smi")
    ax.barh(y + 0.2, c, 0.4, color="#dd8452", label="laptop, counted")
    ax.axvline(1.0, color="black", lw=1)
    ax.set_yticks(y, labels)
    ax.set_ylim(len(labels) - 0.5, -0.5)
    ax.set_xlabel("memory / one-device baseline")
    ax.legend(frameon=False, loc="lower center", bbox_to_anchor=(0.4, 1.0), ncol=2)
    fig.tight_layout()
    return fig

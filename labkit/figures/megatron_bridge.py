"""Figures of the chapter "From labkit to Megatron-LM" (book/megatron-bridge.ipynb), in the house style.

    round_trip(flags, log, n)         flags out (``to_flags``), logs in (``parse_log``), one run
    slurm_job(processes, topo)        a Slurm job's processes on two nodes, its stores, TP and DP groups
    memory_vs_measured(table)         labkit.calc's memory per GPU beside what the tutorial measured

Each draws what labkit computed or recorded (the flags ``to_flags`` wrote, the columns ``parse_log``
read, the process table of a real Slurm run, ``experiments.report``), never typed-in numbers.
"""
from __future__ import annotations

from .style import SMALL_PT, new

BLUE, ORANGE, GREEN, GREY, RED = "#3b6ea8", "#d9822b", "#3a8a4f", "#6b6b6b", "#b03a2e"


def _canvas(height: float):
    """A figure whose one axes fills it, in units 0..1 both ways (a diagram, no data axes)."""
    fig, ax = new(4.8, height)          # + the 0.1 in margins of a tight bounding box: 5 in
    ax.set_position([0, 0, 1, 1])
    ax.set_axis_off()
    ax.set_xlim(-0.01, 1.01)
    ax.set_ylim(-0.01, 1.01)
    return fig, ax


def _box(ax, x, y, w, h, title, lines=(), color=BLUE, size=SMALL_PT):
    """A rounded box with a bold title and monospace lines, in axes units (0..1 x 0..1)."""
    from matplotlib.patches import FancyBboxPatch
    ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.006,rounding_size=0.015",
                                fc=color + "18", ec=color, lw=1.2))
    ax.text(x + 0.015, y + h - 0.02, title, ha="left", va="top", fontsize=size + 0.5,
            fontweight="bold", color=color)
    for i, line in enumerate(lines):
        ax.text(x + 0.015, y + h - 0.075 - i * 0.052, line, ha="left", va="top", fontsize=size,
                family="DejaVu Sans Mono")


def _arrow(ax, xy0, xy1, text="", color=GREY, style="-|>", ls="-", text_xy=None):
    ax.annotate("", xy=xy1, xytext=xy0, arrowprops=dict(arrowstyle=style, color=color, lw=1.3, ls=ls,
                                                        shrinkA=0, shrinkB=0))
    if text:
        tx, ty = text_xy or ((xy0[0] + xy1[0]) / 2, (xy0[1] + xy1[1]) / 2)
        ax.text(tx, ty, text, ha="center", va="center", fontsize=SMALL_PT, color=color,
                bbox=dict(fc="white", ec="none", pad=0.5))


def _pairs(flags: list[str]) -> list[str]:
    """``["--a", "1", "--b"]`` -> ``["--a 1", "--b"]``: one flag and its value per item."""
    out, i = [], 0
    while i < len(flags):
        takes = i + 1 < len(flags) and not flags[i + 1].startswith("--")
        out.append(" ".join(flags[i:i + 1 + takes]))
        i += 1 + takes
    return out


def round_trip(flags: list[str], log, n_megatron_args: int):
    """Flags out, logs in: the flags ``to_flags`` wrote, the two programs that read them, the log
    format both write, and the columns ``parse_log`` made of it (``log``: its DataFrame, one row per
    iteration). ``n_megatron_args``: how many arguments Megatron's list holds."""
    import textwrap
    fig, ax = _canvas(4.6)
    wrap = lambda text, n=3: textwrap.wrap(text, 52)[:n]   # noqa: E731 - 52 monospace chars per line
    pairs = _pairs(flags)
    _box(ax, 0, 0.75, 1, 0.25, f"to_flags(config): {len(pairs)} flags, each one of Megatron's "
         f"{n_megatron_args}", wrap(" ".join(flags)) + ["..."], color=BLUE)
    _box(ax, 0, 0.52, 0.47, 0.17, "labkit (CPU or GPU)", ["python -m labkit", "  train FLAGS"], color=GREEN)
    _box(ax, 0.53, 0.52, 0.47, 0.17, "Megatron-LM (GPUs)", ["torchrun pretrain_gpt.py", "  FLAGS"],
         color=ORANGE)
    it = log.iloc[0]
    line = (f"iteration {int(it['iteration'])}/ {int(it['train_iters'])} | consumed samples: "
            f"{int(it['consumed_samples'])} | ... | lm loss: {it['lm_loss']:.6E} | grad norm: "
            f"{it['grad_norm']:.3f} | ...")
    _box(ax, 0, 0.26, 1, 0.20, "one log format, Megatron's (logs.txt)", wrap(line, 2), color=GREY)
    cols = ", ".join(c for c in log.columns)
    _box(ax, 0, 0.0, 1, 0.21, f"parse_log(text): a table of {len(log.columns)} columns", wrap(cols, 3),
         color=BLUE)
    for x in (0.235, 0.765):
        _arrow(ax, (x, 0.75), (x, 0.69))            # the flags, into each program
        _arrow(ax, (x, 0.52), (x, 0.46))            # each program's log
    _arrow(ax, (0.5, 0.26), (0.5, 0.20))
    return fig


def _role(p: dict) -> str:
    cmd, env = p["cmd"], p["env"]
    if "RANK" in env:
        return "rank"
    if "rendezvous_store" in cmd:
        return "store"
    if "torchrun" in cmd and not cmd.startswith("srun"):
        return "agent"
    if "launch.sh" in cmd:
        return "batch"
    return ""


def slurm_job(processes: dict, topo):
    """A Slurm job's processes on its nodes (``processes``: node -> process records, as
    ``examples/slurm/local_cluster.py`` snapshots them), the rendezvous store the agents meet at,
    and the ranks' TP (inside a node) and DP (across nodes) groups of ``topo``."""
    fig, ax = _canvas(4.4)
    nodes = sorted(processes)
    width = 0.48
    rank_x, agents, store = {}, [], None
    for k, node in enumerate(nodes):
        ps = processes[node]
        x0 = k * (1 - width)
        nodeid = next((p["env"]["SLURM_NODEID"] for p in ps if "SLURM_NODEID" in p["env"]), "?")
        _box(ax, x0, 0.16, width, 0.84, f"node {node}", [f"SLURM_NODEID {nodeid}"], color=GREY)
        roles = {r: [p for p in ps if _role(p) == r] for r in ("batch", "store", "agent", "rank")}
        if roles["batch"]:
            _box(ax, x0 + 0.02, 0.72, width - 0.04, 0.14, "batch script", ["launch.sh"], color=GREY)
            _box(ax, x0 + 0.02, 0.55, width - 0.04, 0.14, "rendezvous store", ["rendezvous_store.py"],
                 color=ORANGE)
            store = (x0 + width / 2, 0.55)
        for _ in roles["agent"]:
            group = next((p["env"]["GROUP_RANK"] for p in roles["rank"]), "?")
            _box(ax, x0 + 0.02, 0.37, width - 0.04, 0.14, "torchrun agent", [f"GROUP_RANK {group}"],
                 color=BLUE)
            agents.append(x0 + width / 2)
        ranks = sorted(roles["rank"], key=lambda p: int(p["env"]["RANK"]))
        w = (width - 0.02 * (len(ranks) + 1)) / max(len(ranks), 1)
        for j, p in enumerate(ranks):
            x = x0 + 0.02 + j * (w + 0.02)
            _box(ax, x, 0.19, w, 0.13, f"rank {p['env']['RANK']}", [f"local {p['env']['LOCAL_RANK']}"],
                 color=GREEN)
            rank_x[int(p["env"]["RANK"])] = x + w / 2
    for x in agents:                          # every agent is a client of the one store
        if store is not None:
            _arrow(ax, (x, 0.51), (store[0] + 0.05 * ((x > store[0]) - (x < store[0])), store[1]),
                   color=ORANGE, ls="--")
    for group in topo.groups("tp"):           # TP: the ranks of one node
        xs = [rank_x[r] for r in group if r in rank_x]
        if len(xs) > 1:
            ax.plot([min(xs), max(xs)], [0.335, 0.335], color=GREEN, lw=2.5)
            ax.text(sum(xs) / len(xs), 0.34, "TP", ha="center", va="bottom", fontsize=SMALL_PT,
                    color=GREEN, bbox=dict(fc="white", ec="none", pad=0.2))
    for i, group in enumerate(topo.groups("dp")):   # DP: across the nodes, below them
        xs = sorted(rank_x[r] for r in group if r in rank_x)
        y = 0.11 - 0.055 * i
        ax.plot(xs, [y] * len(xs), color=RED, lw=1.5, marker="o", ms=4)
        for x in xs:
            ax.plot([x, x], [y, 0.19], color=RED, lw=0.8, ls=":")
        ax.text(0.5, y + 0.008, f"DP ranks {', '.join(map(str, group))}", ha="center", va="bottom",
                fontsize=SMALL_PT, color=RED, bbox=dict(fc="white", ec="none", pad=0.2))
    return fig


def memory_vs_measured(table):
    """labkit.calc's memory per GPU (bars) beside the tutorial's measurement (dots; "OOM" for runs
    that ran out of memory) for every catalogued experiment, with each GPU's memory as a line.
    ``table``: ``labkit.experiments.report`` (columns id, layout, meas. GiB/GPU, calc GiB/GPU)."""
    from ..experiments.catalogue import CATALOGUE
    from ..calc.hardware import CLUSTERS
    groups = {}
    for _, row in table.iterrows():
        e = CATALOGUE[row["id"]]
        groups.setdefault(CLUSTERS[e.cluster].gpu, []).append((e, row))
    fig, axes = new(5.0, 5.2, nrows=len(groups), ncols=1,
                    gridspec_kw={"height_ratios": [len(v) for v in groups.values()]})
    for ax, (gpu, rows) in zip(axes, groups.items()):
        capacity = gpu.memory_bytes / 2 ** 30
        labels = [e.label if e.note == "003" else f"{e.label} {e.strategy} {e.seq_length // 1024}K"
                  for e, _ in rows]
        for i, (e, row) in enumerate(rows):
            ax.barh(i, row["calc GiB/GPU"], color=BLUE, height=0.6,
                    label="labkit.calc" if i == 0 else None)
            measured = row["meas. GiB/GPU"]
            if measured == "OOM":
                ax.text(capacity, i, " OOM", va="center", ha="left", fontsize=SMALL_PT, color=RED)
            else:
                ax.plot(float(measured), i, "o", color=ORANGE, ms=6,
                        label="measured" if i == 0 else None)
        ax.axvline(capacity, color=GREY, lw=1, ls="--")
        ax.set_yticks(range(len(rows)), labels)
        ax.invert_yaxis()
        ax.set_xlim(0, capacity * 1.18)
        ax.set_title(f"{e.model} on {gpu.name}: {capacity:.0f} GiB (dashed)", loc="left")
    axes[-1].set_xlabel("memory per GPU (GiB)")
    axes[0].legend(loc="lower right", frameon=False)
    fig.tight_layout()
    return fig

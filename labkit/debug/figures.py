"""The figures of the chapter "When training goes wrong", drawn from labkit's own objects.

    reshard_figure()          the rows of a SwiGLU fc1 weight each rank holds under TP2 and TP4
                              (labkit.shard_plan.stacked), and the saved pieces a TP4 rank reads
    divergence_figure(d)      every fingerprint's difference from one device, in the run's order
                              (a ``first_divergence`` result's profile), the first divergence marked
    flight_recorder_figure(f) each rank's collectives by sequence number (Flight Recorder entries)
    goodput_figure(...)       goodput against the checkpoint interval, synchronous vs asynchronous
                              saving (labkit.calc.goodput), Daly's optimum marked

House style: ``labkit.figures.new`` / ``show`` (vector, deterministic, legible on a phone).
"""
from __future__ import annotations

import math

from .. import figures
from .. import shard_plan as sp_

RANK_COLORS = ["#00798c", "#d1495b", "#edae49", "#66a182", "#2e4057", "#8d96a3", "#a05195", "#f95d6a"]
PHASE_COLORS = {"weights": "#8d96a3", "forward": "#00798c", "backward": "#edae49", "grads": "#d1495b"}


def reshard_figure(ffn: int = 8, tps=(2, 4)):
    """Dense rows of SwiGLU's fc1 = [gate; up] (2 x ffn rows) coloured by the TP rank holding them."""
    fig, ax = figures.new(5.0, 2.4)
    n = 2 * ffn
    for row, t in enumerate(tps):
        y = len(tps) - 1 - row
        for r in range(t):
            for b in sp_.stacked(n, 2, t, r):
                ax.add_patch(_rect(b.start, y, b.size, RANK_COLORS[r]))
                ax.text(b.start + b.size / 2, y + 0.4, f"r{r}", ha="center", va="center", color="white",
                        fontsize=figures.style.SMALL_PT, fontweight="bold")
        ax.text(-0.4, y + 0.4, f"TP{t}", ha="right", va="center")
    ax.axvline(ffn, color="black", lw=1.2)
    ax.text(ffn / 2, len(tps) + 0.15, "gate rows", ha="center")
    ax.text(ffn + ffn / 2, len(tps) + 0.15, "up rows", ha="center")
    ax.set_xlim(-2.2, n + 0.2)
    ax.set_xticks(range(0, n + 1, max(1, n // 4)))
    ax.set_ylim(-0.3, len(tps) + 0.6)
    ax.set_xlabel("dense row of linear_fc1.weight (its global offset in the checkpoint)")
    ax.set_yticks([])
    ax.spines["left"].set_visible(False)
    return figures.show(fig)


def _rect(x, y, w, color):
    from matplotlib.patches import Rectangle
    return Rectangle((x, y), w, 0.8, facecolor=color, edgecolor="white", lw=1.5)


def divergence_figure(divergence, title: str = ""):
    """Largest relative difference of each fingerprint (over the ranks) in the run's order."""
    from matplotlib.ticker import NullLocator
    fig, ax = figures.new(3.6, 2.8)                 # + the legend at the right: <= 5 in in all
    prof = divergence.profile
    first = next(i for i, p in enumerate(prof) if p[0] == _first_key(divergence, prof))
    floor = 1e-17
    for phase, color in PHASE_COLORS.items():
        xs = [i for i, p in enumerate(prof) if p[1] == phase]
        ys = [max(prof[i][5], floor) for i in xs]
        if xs:
            ax.scatter(xs, ys, s=9, color=color, label=phase, zorder=3)
    ax.axvline(first, color="black", lw=1, ls="--")
    ax.axhline(1e-9, color="#8d96a3", lw=0.8)
    ax.text(0, 2e-9, "tolerance", fontsize=figures.style.SMALL_PT, color="#555555")
    ax.annotate("first divergence", (first, max(prof[first][5], floor)), xytext=(10, -28),
                textcoords="offset points", arrowprops=dict(arrowstyle="->", lw=0.8))
    ax.set_yscale("log")
    ax.set_ylim(floor / 3, 10)
    # decade ticks as plain text ("1e-12"): mathtext's superscripts would be below 9 px on a phone
    ax.set_yticks([10.0 ** k for k in (-16, -12, -8, -4, 0)], ["1e-16", "1e-12", "1e-8", "1e-4", "1"])
    ax.yaxis.set_minor_locator(NullLocator())
    ax.set_xlabel("fingerprints in the run's order")
    ax.set_ylabel("max rel. difference")
    ax.legend(loc="center left", bbox_to_anchor=(1.0, 0.5), frameon=False)
    if title:
        ax.set_title(title)
    return figures.show(fig)


def _first_key(d, prof):
    for p in prof:
        if (p[1], p[2], p[4]) == (d.phase, d.layer, d.microbatch) and p[5] > 1e-9:
            return p[0]
    return prof[0][0]


def flight_recorder_figure(entries: dict):
    """{rank: [{"seq", "op", ...}]} -> one row of boxes per rank; sequence numbers where the ops
    differ across ranks are outlined in red."""
    fig, ax = figures.new(5.0, 0.9 + 0.6 * len(entries))
    ops = {r: {e["seq"]: e["op"] for e in es} for r, es in entries.items()}
    seqs = sorted({s for o in ops.values() for s in o})
    for y, rank in enumerate(sorted(entries, reverse=True)):
        for x, s in enumerate(seqs):
            op = ops[rank].get(s)
            if op is None:
                continue
            bad = len({ops[r].get(s) for r in ops}) > 1
            ax.add_patch(_rect(x, y, 0.95, "#f3d9dc" if bad else "#d9ecef"))
            ax.patches[-1].set_edgecolor("#d1495b" if bad else "white")
            ax.text(x + 0.47, y + 0.4, op.replace("_", " "), ha="center", va="center",
                    fontsize=figures.style.SMALL_PT)
        ax.text(-0.15, y + 0.4, f"rank {rank}", ha="right", va="center")
    ax.set_xticks([x + 0.47 for x in range(len(seqs))], [str(s) for s in seqs])
    ax.set_xlabel("collective sequence number")
    ax.set_xlim(-1.2, len(seqs))
    ax.set_ylim(-0.2, len(entries))
    ax.set_yticks([])
    ax.spines["left"].set_visible(False)
    return figures.show(fig)


def goodput_figure(sync_seconds: float, async_block_seconds: float, mtbf_seconds: float,
                   restart_seconds: float = 0.0):
    """Goodput against the interval between checkpoints (hours), synchronous and asynchronous
    saving; Daly's interval of each marked."""
    from ..calc import goodput as gp
    fig, ax = figures.new(5.0, 2.8)
    hours = [10 ** (k / 40) for k in range(-100, 61)]      # ~0.003 h to 31 h
    cases = [("synchronous save", sync_seconds, 0.0, "#d1495b"),
             ("asynchronous save", async_block_seconds, sync_seconds, "#00798c")]
    for label, block, lag, color in cases:
        ys = [100 * gp.goodput(h * 3600, block, mtbf_seconds, restart_seconds, lag) for h in hours]
        ax.plot(hours, ys, color=color, label=label)
        best = gp.daly_interval(block, mtbf_seconds)
        g = 100 * gp.goodput(best, block, mtbf_seconds, restart_seconds, lag)
        ax.plot([best / 3600], [g], "o", color=color)
        ax.annotate(f"{g:.1f}% at {_hm(best)}", (best / 3600, g), xytext=(-20, -22 if color == "#d1495b" else 8),
                    textcoords="offset points", fontsize=figures.style.SMALL_PT, color=color)
    ax.set_xscale("log")
    ax.set_xticks([0.01, 0.1, 1, 10], ["0.01", "0.1", "1", "10"])   # no superscripts: legible on a phone
    ax.minorticks_off()
    top = max(100 * gp.best_goodput(b, mtbf_seconds, restart_seconds, lag)["goodput"] for _, b, lag, _ in cases)
    ax.set_ylim(math.floor(top) - 6, min(100.5, math.ceil(top) + 1))
    ax.set_xlabel("hours of training between checkpoints")
    ax.set_ylabel("goodput (%)")
    ax.legend(loc="lower center", frameon=False)
    return figures.show(fig)


def _hm(seconds: float) -> str:
    h, m = divmod(round(seconds / 60), 60)
    return f"{h} h {m:02d}" if h else f"{m} min"

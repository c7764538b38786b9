"""Figures of the chapter "Memory knobs", drawn from measured runs (``labkit.measure.memory_knobs``)
and ``labkit.calc``. Each function returns a matplotlib Figure in the house style."""
from __future__ import annotations

from .style import SMALL_PT, new

PARTS = (("params", "#1f5fa8"), ("grads", "#e07b00"), ("optimizer", "#2e7d32"))


def memory_per_precision(rows: list[dict]):
    """Bytes per parameter each rank held, stacked (params, grads, optimizer), one bar per
    configuration; a black tick marks labkit.calc's total. ``rows``: {"config", "params", "grads",
    "optimizer", "calc"} in bytes per parameter."""
    fig, ax = new(4.0, 0.45 * len(rows) + 1.2)      # the tick labels widen it to about 5 in
    for i, r in enumerate(rows):
        left = 0.0
        for part, colour in PARTS:
            ax.barh(i, r[part], left=left, color=colour, label=part if i == 0 else None)
            left += r[part]
        ax.plot([r["calc"]] * 2, [i - 0.42, i + 0.42], color="black", lw=2, label="labkit.calc" if i == 0 else None)
        ax.text(left + 0.3, i, f"{left:g} B", va="center", fontsize=SMALL_PT)
    ax.set_yticks(range(len(rows)), [r["config"] for r in rows])
    ax.set_ylim(len(rows) - 0.5, -0.5)
    ax.set_xlim(0, max(r["params"] + r["grads"] + r["optimizer"] for r in rows) * 1.25)
    ax.set_xlabel("bytes per parameter on one rank (DP 2)")
    ax.legend(frameon=False, fontsize=SMALL_PT, ncol=4, loc="lower center", bbox_to_anchor=(0.45, 1.0))
    return fig


def live_params(timeline: dict):
    """Live parameter bytes at each unit boundary of one ZeRO-3 step (forward then backward):
    whole-model vs per-layer, with one shard + the two largest units dashed."""
    fig, ax = new(5.0, 3.4)
    mib = 2.0 ** 20
    for kind, colour in (("whole-model", "#9e9e9e"), ("per-layer", "#1f5fa8")):
        ys = [b / mib for _, _, b in timeline[kind]]
        xs = [i / (len(ys) - 1) for i in range(len(ys))]       # the step's boundaries, 0 to 1
        ax.step(xs, ys, where="post", color=colour, lw=2, label=f"{kind} ZeRO-3")
    units = timeline["units"]
    shard = sum(s for _, _, s in units)
    two = sum(sorted(full for _, full, _ in units)[-2:])
    ax.axhline((shard + two) / mib, ls="--", color="black", lw=1, label="one shard + two units")
    ax.axhline(shard / mib, ls=":", color="black", lw=1, label="one shard")
    ax.set_xlabel("one step: unit boundaries, forward then backward")
    ax.set_ylabel("live parameters (MiB)")
    ax.set_ylim(0, None)
    ax.set_xticks([0, 0.5, 1], ["start", "", "end"])
    ax.legend(frameon=False, fontsize=SMALL_PT, ncol=2, loc="upper center", bbox_to_anchor=(0.5, -0.22))
    return fig


def recompute_tradeoff(saved: dict, seconds: dict | None = None, flops_ratio: dict | None = None):
    """Left: bytes one layer keeps for its backward, none / selective / full (measured). Right: time
    per training step relative to no recomputation: bars are the analytic FLOPs ratio
    (``flops_ratio``, when given), black dots the measured median step time of each mode over its
    repeated steps with a whisker from the fastest to the slowest step (``seconds``: {mode: [step
    times]}, or one number per mode), each divided by the median of "none": where the whiskers
    overlap, the measured difference is within this machine's noise."""
    import statistics
    fig, (a1, a2) = new(5.0, 2.8, 1, 2)
    modes = ["none", "selective", "full"]
    colours = ["#9e9e9e", "#1f5fa8", "#2e7d32"]
    a1.bar(modes, [saved[m] / 1024 for m in modes], color=colours)
    a1.set_ylabel("saved per layer (KiB)")
    if flops_ratio is not None:
        a2.bar(modes, [flops_ratio[m] for m in modes], color=colours, alpha=0.45 if seconds else 1.0,
               label="FLOPs (analytic)")
        a2.set_ylim(0, max(flops_ratio.values()) * 1.15)
    samples = {m: list(seconds[m]) if isinstance(seconds[m], (list, tuple)) else [seconds[m]]
               for m in modes} if seconds else {}
    base = statistics.median(samples["none"]) if samples else 1.0
    for i, m in enumerate(modes if samples else []):
        r = [x / base for x in samples[m]]
        mid = statistics.median(r)
        a2.errorbar([i], [mid], yerr=[[mid - min(r)], [max(r) - mid]], fmt="o", color="black", ms=4,
                    capsize=3, label="measured (median, min-max)" if i == 0 else None)
    a2.axhline(1.0, color="black", lw=0.8)
    a2.set_ylabel("per step / none")
    if samples and flops_ratio is not None:
        a2.legend(fontsize=SMALL_PT, loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=1, frameon=False)
    for ax in (a1, a2):
        ax.tick_params(axis="x", labelsize=SMALL_PT)
    fig.tight_layout()
    return fig

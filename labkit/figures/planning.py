"""Figures of the chapter "Planning a run": the planner as a flow with its counts (``fig_plan_flow``),
the attention curves the step-time model reads, its predictions against published measurements, its
residuals, and its error per source.

Each function takes plain data that ``labkit.calc`` (kernels, runs, evaluate) computes and returns
a figure in the house style (``labkit.figures.new``); the notebook shows it with ``show``.
"""
from __future__ import annotations

import math

from .style import new

PALETTE = ("#1b6ca8", "#d1495b", "#2e933c", "#edae49", "#6a4c93", "#00798c", "#8c564b", "#e377c2",
           "#4d4d4d", "#b07aa1", "#17becf", "#bcbd22")


def _short(n: float) -> str:
    """1024 -> 1K, 1048576 -> 1M: plain tick labels."""
    for unit, div in (("M", 2 ** 20), ("K", 2 ** 10)):
        if n >= div:
            return f"{n / div:g}{unit}"
    return f"{n:g}"


def colors(sources) -> dict:
    """One color per source, stable in the order given."""
    return {s: PALETTE[i % len(PALETTE)] for i, s in enumerate(sources)}


def attention_curves(curves: list, seqs: list):
    """``curves``: [(label, points {seq: TFLOP/s} published, fitted function seq -> TFLOP/s)].
    Published bars as markers, the fitted E_inf s/(s + s_0) as lines, key length on a log axis."""
    fig, ax = new(5.0, 3.6)
    xs = [2 ** (i / 4) for i in range(int(4 * math.log2(seqs[0])), int(4 * math.log2(seqs[-1])) + 1)]
    for i, (label, points, f) in enumerate(curves):
        c = PALETTE[i % len(PALETTE)]
        ax.plot(xs, [f(x) for x in xs], color=c, lw=1.6, label=label)
        ax.plot(list(points), list(points.values()), "o", color=c, ms=4)
    ax.set_xscale("log", base=2)
    ax.set_xticks(seqs, [_short(s) for s in seqs])
    ax.minorticks_off()
    ax.set(xlabel="key length per attention call (tokens)", ylabel="TFLOP/s (causal)", ylim=(0, None))
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2, frameon=False)
    ax.grid(alpha=0.3)
    return fig


def predicted_vs_measured(points: list, sources: list):
    """``points``: [(source, measured s, predicted s, held_out: bool)]. Log-log, y = x dashed, +-10%
    dotted; circles = predicted with the source left out of the fit, triangles = frozen held-out set."""
    fig, ax = new(5.0, 5.6)
    col = colors(sources)
    lo = min(min(m, p) for _, m, p, _ in points) / 1.5
    hi = max(max(m, p) for _, m, p, _ in points) * 1.5
    ax.plot([lo, hi], [lo, hi], "k--", lw=1)
    for f in (0.9, 1.1):
        ax.plot([lo, hi], [lo * f, hi * f], "k:", lw=0.8)
    groups = {}
    for s, m, p, held in points:                 # one scatter per source and kind: small, fast SVG
        groups.setdefault((s, held), []).append((m, p))
    for (s, held), xy in groups.items():
        ax.scatter([x for x, _ in xy], [y for _, y in xy], s=16 if held else 10, marker="^" if held else "o",
                   color=col[s], edgecolors="k" if held else "none", linewidths=0.4, alpha=0.85)
    ax.set(xscale="log", yscale="log", xlim=(lo, hi), ylim=(lo, hi), aspect="equal",
           xlabel="measured step time (s)", ylabel="predicted step time (s)")
    ticks = [10.0 ** k for k in range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1)]
    labels = [f"{t:g}" for t in ticks]          # plain text: mathtext exponents print too small
    ax.set_xticks(ticks, labels)
    ax.set_yticks(ticks, labels)
    ax.minorticks_off()
    ax.set(xlim=(lo, hi), ylim=(lo, hi))
    for s in sources:
        held = any(h for x, _, _, h in points if x == s)
        ax.scatter([], [], marker="^" if held else "o", color=col[s], label=s + (" (held out)" if held else ""))
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=2, frameon=False, handletextpad=0.2,
              columnspacing=0.8)
    return fig


def residual_panels(panels: list, sources: list):
    """``panels``: [(x label, log2 axis?, [(source, x, error, held_out)])], one row each; errors in
    percent (circles: source left out of the fit; triangles: frozen held-out set), band +-10%."""
    fig, axes = new(5.0, 2.0 * len(panels) + 0.4, nrows=len(panels))
    col = colors(sources)
    top = 10 * math.ceil(max(abs(100 * p[2]) for _, _, pts in panels for p in pts) / 10)
    for ax, (label, log2, pts) in zip(axes, panels):
        ax.axhspan(-10, 10, color="0.9", lw=0)
        ax.axhline(0, color="k", lw=0.8)
        groups = {}
        for s, x, e, held in pts:                # one scatter per source and kind: small, fast SVG
            groups.setdefault((s, held), []).append((x, 100 * e))
        for (s, held), xy in groups.items():
            ax.scatter([x for x, _ in xy], [y for _, y in xy], s=14 if held else 9, marker="^" if held else "o",
                       color=col[s], edgecolors="k" if held else "none", linewidths=0.3, alpha=0.8)
        if log2:
            ax.set_xscale("log", base=2)
            xs = [p[1] for p in pts]
            ticks = [2 ** k for k in range(math.floor(math.log2(min(xs))), math.ceil(math.log2(max(xs))) + 1, 2)]
            ax.set_xticks(ticks, [_short(t) for t in ticks])
            ax.minorticks_off()
        ax.set(xlabel=label, ylabel="error (%)", ylim=(-top, top))
    fig.tight_layout()
    return fig


def error_by_source(rows: list):
    """``rows``: [(source, n, LOSO median, (lo, hi) bootstrap, 13-constant LOSO median or None)]: the
    median |error| with the source left out of the fit, its 95% interval, and that of the variant
    with 13 fitted constants (``data/step_time_before.json``) judged the same way."""
    fig, ax = new(3.9, 0.42 * len(rows) + 0.9)   # + the source names at the left: <= 5 in in all
    ys = list(range(len(rows)))[::-1]
    for y, (s, n, med, (lo, hi), rich) in zip(ys, rows):
        ax.plot([100 * lo, 100 * hi], [y, y], color="#1b6ca8", lw=2)
        ax.plot(100 * med, y, "o", color="#1b6ca8", ms=5)
        if rich is not None:
            ax.plot(100 * rich, y, "x", color="#d1495b", ms=6, mew=1.6)
    ax.set_yticks(ys, [f"{s} ({n})" for s, n, *_ in rows])
    ax.axvline(6, color="0.5", ls=":", lw=1)
    ax.axvline(12, color="0.5", ls="--", lw=1)
    ax.plot([], [], "o-", color="#1b6ca8", label="this model, 95% interval")
    ax.plot([], [], "x", color="#d1495b", mew=1.6, label="13-constant model")
    ax.set(xlabel="median |error|, source left out of the fit (%)", xlim=(0, None))
    ax.legend(loc="lower right", frameon=False)
    return fig


RULE_WORDS = (("global_batch_size", "batch"), ("micro_batch_size", "mb"), ("num_layers", "layers"),
              ("num_attention_heads", "heads"), ("with sequence_parallel, ", ""), ("seq_length", "seq"))


def _rule(reason: str) -> str:
    """'rule: num_layers divisible by PP; 80 % 3 != 0' -> 'layers divisible by PP' (short names)."""
    name = reason.removeprefix("rule: ").split(";")[0].split(" (")[0]
    for long, short in RULE_WORDS:
        name = name.replace(long, short)
    return name


def fig_plan_flow(model_name: str = "megatron-145b", cluster_name: str = "dgx-a100", nodes: int = 192,
                  global_batch_size: int = 2304, micro_batch_sizes=(1, 2, 4), recompute=("selective", "full")):
    """The planner as a flow, top to bottom, with the counts ``calc.plan`` returns for these inputs:
    every candidate layout (``candidate_layouts``), those Megatron's rules refuse (``validate``; the
    most frequent rules named), those that do not fit in memory (``peak_memory`` over the stages),
    those costed (``step_time``) and the winner of the ranking by tokens per second."""
    from collections import Counter

    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

    from .. import calc
    from ..calc.planner import candidate_layouts
    model, cluster = calc.model(model_name), calc.CLUSTERS[cluster_name].with_(nodes=nodes)
    search = dict(micro_batch_sizes=micro_batch_sizes, recompute=recompute)
    result = calc.plan(model, cluster, global_batch_size, **search)
    rules = Counter(_rule(r) for par, r in candidate_layouts(model, cluster, global_batch_size, **search) if par is None)
    if sum(rules.values()) != result["invalid"]:
        raise ValueError("the planner's refusals and candidate_layouts' disagree")
    ranked, best = result["ranked"], result["ranked"][0] if result["ranked"] else None
    n_all = len(ranked) + result["too_big"] + result["invalid"]
    gpu = cluster.gpu
    W, box_h, gap, x1 = 5.0, 0.48, 0.26, 2.55              # data units are inches; x1: main column's right
    stages = [
        (f"candidate_layouts: {n_all:,}\nTP x PP x mb x recompute", None),
        ("validate: Megatron's rules", [f"{result['invalid']:,} break a rule, most:"]
         + [f"{n:,}: {name}" for name, n in rules.most_common(2)]),
        (f"peak_memory, every stage\n<= {result['capacity'] / gpu.memory_bytes:.0%} of {gpu.memory_bytes / 2**30:.0f} GiB",
         [f"{result['too_big']:,} do not fit"]),
        (f"step_time of {len(ranked):,} layouts\ncompute, bubble, comm", None),
        ("rank by tokens/s", [f"TP {best['tp']} PP {best['pp']} DP {best['dp']} mb {best['micro_batch_size']}",
                              f"{best['recompute']} recompute", f"{best['tokens_per_s']:,.0f} tokens/s"]
         if best else ["no layout fits"]),
    ]
    top = 0.1 + box_h + gap
    H = top + len(stages) * (box_h + gap)
    fig, ax = new(W, H)
    inputs = (f"model\n{model_name}", f"cluster\n{nodes} x {cluster.gpus_per_node} {gpu.name}",
              f"global batch\n{global_batch_size:,}")
    widths = (1.45, 2.15, 1.2)
    x = 0.05
    for text, w in zip(inputs, widths):                # the three inputs side by side
        ax.add_patch(FancyBboxPatch((x, 0.1), w, box_h, boxstyle="round,pad=0,rounding_size=0.06",
                                    fc="#eeeeee", ec="#888888"))
        ax.text(x + w / 2, 0.1 + box_h / 2, text, ha="center", va="center")
        x += w + 0.05
    arrow = dict(arrowstyle="-|>", mutation_scale=12, color="black", lw=1.2)
    for i, (text, side) in enumerate(stages):
        y = top + i * (box_h + gap)
        ax.add_patch(FancyArrowPatch((x1 / 2, y - gap), (x1 / 2, y), **arrow))
        final = i == len(stages) - 1
        ax.add_patch(FancyBboxPatch((0.05, y), x1 - 0.05, box_h, boxstyle="round,pad=0,rounding_size=0.06",
                                    fc="#1b6ca8" if final else "#dbe8f3", ec="#1b6ca8"))
        ax.text(x1 / 2, y + box_h / 2, text, ha="center", va="center", color="white" if final else "black")
        if side:
            ax.add_patch(FancyArrowPatch((x1, y + box_h / 2), (x1 + 0.25, y + box_h / 2), **arrow))
            ax.text(x1 + 0.3, y + box_h / 2, "\n".join(side), va="center",
                    color="#1b6ca8" if final else "#d1495b")
    ax.set_xlim(0, W)
    ax.set_ylim(H, 0)
    ax.axis("off")
    fig.subplots_adjust(0, 0, 1, 1)
    return fig

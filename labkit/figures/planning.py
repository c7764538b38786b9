"""Figures of the chapter "Planning a run": the attention curves the step-time model reads, its
predictions against published measurements, its residuals, and its error per source.

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

"""Figures of the chapter "Low precision", drawn from data/envelopes.json (``labkit.drift``).
Each function returns a matplotlib Figure in the house style."""
from __future__ import annotations

from .style import SMALL_PT, new

COLOURS = {"DP": "#1f5fa8", "ZeRO": "#6a3d9a", "TP+SP": "#e07b00", "CP": "#2e7d32", "PP/VPP": "#c62828",
           "EP": "#00838f", "composed": "#5d4037"}


def envelopes(data: dict, precisions=("fp32", "bf16", "fp16"), channel: str = "loss"):
    """One panel per precision: per step, the measured band of each family (the largest relative
    drift of any seed up to that step; 0 drawn at the panel's floor) and the derived bound
    (dashed; worst case, first order) with its probabilistic counterpart (dotted), log scale."""
    fig, axes = new(5.0, 6.2, len(precisions), 1)
    for ax, prec in zip(axes, precisions):
        cells = {f: c[prec] for f, c in data["cells"].items() if "band" in c.get(prec, {})}
        floor = min([x for c in cells.values() for x in c["band"][channel] if x > 0] + [1e-9]) / 10
        for fam, c in cells.items():
            ys = [max(x, floor) for x in c["band"][channel]]
            ax.plot(range(1, len(ys) + 1), ys, color=COLOURS.get(fam, "black"), lw=1.6, label=fam)
        derived = max((c for c in cells.values() if c["derived"]), key=lambda c: c["n"], default=None)
        if derived is not None:
            ax.plot(range(1, len(derived["derived"]) + 1), derived["derived"], "k--", lw=1.2,
                    label="derived bound (largest n)")
            ax.plot(range(1, len(derived["probabilistic"]) + 1), derived["probabilistic"], "k:", lw=1.2,
                    label="probabilistic")
        ax.set_yscale("log")
        from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter
        ax.yaxis.set_major_locator(LogLocator(base=10, numticks=4))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _: f"{y:.0e}".replace("e-0", "e-")))
        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.set_title(f"{prec}: u = 2^{_exp(next(iter(cells.values()))['u'])}" if cells else prec,
                     fontsize=SMALL_PT, loc="left")
        ax.set_ylabel("relative drift")
        steps = max((len(c["band"][channel]) for c in cells.values()), default=1)
        ax.set_xticks([1] + list(range(5, steps + 1, 5)))
    axes[-1].set_xlabel("step")
    seen = {}                                  # every family any panel drew, then the bounds
    for ax in axes:
        for h, label in zip(*ax.get_legend_handles_labels()):
            seen.setdefault(label, h)
    labels = [k for k in COLOURS if k in seen] + [k for k in seen if k not in COLOURS]
    handles = [seen[k] for k in labels]
    fig.legend(handles, labels, frameon=False, fontsize=SMALL_PT, ncol=3, loc="lower center",
               bbox_to_anchor=(0.5, -0.1))
    fig.tight_layout()
    return fig


def _exp(u: float) -> str:
    import math
    return str(round(math.log2(u)))

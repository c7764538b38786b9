"""Figures of the chapter "Low precision": the formats' bit layouts (``torch.finfo`` of the dtypes
labkit trains in, checked against ``labkit.drift.bounds.UNIT_ROUNDOFF``) and the drift envelopes of
data/envelopes.json (``labkit.drift``). Each function returns a matplotlib Figure in the house style."""
from __future__ import annotations

import math

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
    return str(round(math.log2(u)))


FIELDS = (("sign", "#c44e52"), ("exponent", "#4c72b0"), ("mantissa", "#55a868"))


def formats(names=("fp32", "bf16", "fp16", "e4m3", "e5m2")) -> list[dict]:
    """Per format: bits of sign / exponent / mantissa, max, smallest normal and u, all read from
    ``torch.finfo`` (mantissa bits m = -log2 eps, u = eps / 2 = 2^-(m+1)); the FP8 dtypes are
    ``labkit.fp8``'s. Refuses a format whose u disagrees with ``labkit.drift``'s table."""
    import torch

    from ..drift.bounds import UNIT_ROUNDOFF
    from ..fp8 import FORMATS
    dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16,
              **{k.lower(): f.dtype for k, f in FORMATS.items()}}
    out = []
    for name in names:
        fi = torch.finfo(dtypes[name])
        m = round(-math.log2(fi.eps))
        if fi.eps / 2 != UNIT_ROUNDOFF[name]:
            raise ValueError(f"{name}: finfo's u {fi.eps / 2} != labkit.drift's {UNIT_ROUNDOFF[name]}")
        out.append({"name": name if name.startswith(("fp", "bf")) else "fp8 " + name.upper(),
                    "bits": (1, fi.bits - 1 - m, m), "max": fi.max, "normal": fi.smallest_normal,
                    "u": fi.eps / 2})
    return out


def fig_formats(names=("fp32", "bf16", "fp16", "e4m3", "e5m2")):
    """One bar per format, one cell per bit (sign, exponent, mantissa; field widths written in),
    bars to scale; beside each, its largest value, smallest normal number and unit roundoff u."""
    from matplotlib.patches import Rectangle
    rows = formats(names)
    # data units are inches; 4.8 in + the 0.1 in of padding a tight SVG adds each side = 5.0 in
    width, pitch, bit = 4.8, 0.42, 1.9 / 32           # fp32's bar is 1.9 in long
    x0, cols = 0.8, {"max": 2.85, "smallest\nnormal": 3.5, "u": 4.25}
    fig, ax = new(width, pitch * (len(rows) - 1) + 1.25)   # = the y range below
    for i, r in enumerate(rows):
        y = i * pitch
        ax.text(0.02, y, r["name"], va="center")
        x = x0
        for (field, colour), n in zip(FIELDS, r["bits"]):
            ax.add_patch(Rectangle((x, y - 0.14), n * bit, 0.28, fc=colour, ec="white", lw=0.4))
            if n >= 2:                                 # a 1-bit field is too narrow to label
                ax.text(x + n * bit / 2, y, str(n), ha="center", va="center", color="white",
                        fontsize=SMALL_PT)
            x += n * bit
        for cx, value in zip(cols.values(), (_num(r["max"]), _num(r["normal"]), _pow2(r["u"]))):
            ax.text(cx, y, value, va="center", fontsize=SMALL_PT)
    for head, cx in cols.items():
        ax.text(cx, -0.3, head, va="bottom", fontsize=SMALL_PT)
    x, y = x0, pitch * (len(rows) - 1) + 0.4
    for field, colour in FIELDS:                      # the key, under the bars
        ax.add_patch(Rectangle((x, y - 0.07), 0.14, 0.14, fc=colour, ec="none"))
        ax.text(x + 0.19, y, field, va="center", fontsize=SMALL_PT)
        x += 0.35 + 0.08 * len(field)
    ax.set_xlim(0, width)
    ax.set_ylim(y + 0.15, -0.7)
    ax.axis("off")
    fig.subplots_adjust(0, 0, 1, 1)
    return fig


def _num(x: float) -> str:
    """448, 65504, 3.4e38, 6.1e-5: integers as they are, the rest in one significant decimal."""
    if x == int(x) and x < 1e6:
        return f"{int(x)}"
    return f"{x:.1e}".replace("e+", "e").replace("e-0", "e-")


def _pow2(u: float) -> str:
    return f"2^-{round(-math.log2(u))}"

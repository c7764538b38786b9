"""Figures of the chapter "FP8: four ways to scale" and of its lab, drawn from ``labkit.fp8`` objects
(Quantized tensors, DelayedScaling states) and measured runs. Each figure function returns a
matplotlib Figure; ``block_error`` measures what ``block_errors`` draws."""
from __future__ import annotations

import math

from .style import SMALL_PT, new

COLOURS = {"fp32": "#000000", "bf16": "#9e9e9e", "tensorwise": "#1f5fa8", "delayed": "#e07b00",
           "blockwise": "#2e7d32", "mxfp8": "#8e24aa"}


def granularity(quantized: dict):
    """One panel per recipe: the tensor's [rows, cols] grid coloured by log2 of each element's
    dequantization scale, so a panel shows its blocks. ``quantized``: {title: Quantized}."""
    fig, axes = new(5.0, 3.6, nrows=1, ncols=len(quantized), sharey=True)
    mesh = None
    for ax, (title, q) in zip(axes, quantized.items()):
        s = q.expanded_scale_inv().log2()
        rows, cols = s.shape
        bm, bn = min(q.block[0], rows), min(q.block[1], cols)
        grid = s[::bm, ::bn]                                  # one value per block
        xs = [min(j * bn, cols) for j in range(grid.shape[1] + 1)]
        ys = [min(i * bm, rows) for i in range(grid.shape[0] + 1)]
        mesh = ax.pcolormesh(xs, ys, grid.numpy(), cmap="viridis", vmin=-9, vmax=-3, edgecolors="white",
                             linewidth=0.05 if grid.numel() > 64 else 0.8)
        ax.set_title(f"{title}\n{q.scale_inv.numel()} scale{'s' if q.scale_inv.numel() > 1 else ''}",
                     fontsize=SMALL_PT)
        ax.set_xticks([0, cols], ["0", str(cols)])
        ax.set_xlabel("K", fontsize=SMALL_PT)
    axes[0].set_yticks([0, rows], ["0", str(rows)])
    axes[0].set_ylim(rows, 0)
    axes[0].set_ylabel("rows")
    cbar = fig.colorbar(mesh, ax=list(axes), orientation="horizontal", fraction=0.06, pad=0.2)
    cbar.set_label("log2 of the block's scale_inv", fontsize=SMALL_PT)
    return fig


def delayed_spike(trace: dict):
    """Per call: the tensor's amax, the largest value the delayed scale can hold (max / scale) and
    current scaling's (always the amax); and the share of elements delayed scaling saturated.
    ``trace``: {"amax", "delayed_top", "saturated"} lists, one entry per call."""
    fig, (ax, ax2) = new(5.0, 3.8, nrows=2, sharex=True, height_ratios=(2, 1))
    steps = range(1, len(trace["amax"]) + 1)
    ax.semilogy(steps, trace["amax"], color="black", lw=1.5, label="amax of the tensor (= current scaling's top)")
    ax.semilogy(steps, trace["delayed_top"], color=COLOURS["delayed"], lw=1.5, ls="--",
                label="delayed scaling's top (448 / scale)")
    ax.set_ylabel("value")
    # plain tick labels (1, 10, 100): the log axis's 10^k superscripts are too small for a phone
    from matplotlib.ticker import FuncFormatter
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: ""))
    ax.legend(frameon=False, fontsize=SMALL_PT, loc="upper left")
    ax2.bar(steps, [100 * f for f in trace["saturated"]], color=COLOURS["delayed"])
    ax2.set_ylabel("% saturated")
    ax2.set_xlabel("call (one forward)")
    return fig


def loss_curves(curves: dict):
    """Training loss per iteration, one line per precision/recipe: {name: [losses]}; below, each
    curve's difference from fp32."""
    fig, (ax, ax2) = new(5.0, 4.2, nrows=2, sharex=True, height_ratios=(2, 1))
    ref = curves["fp32"]
    for name, losses in curves.items():
        steps = range(1, len(losses) + 1)
        ax.plot(steps, losses, color=COLOURS.get(name, "#555555"), lw=1.2, label=name)
        if name != "fp32":
            ax2.plot(steps, [a - b for a, b in zip(losses, ref)], color=COLOURS.get(name, "#555555"), lw=1.2)
    ax.set_ylabel("loss")
    ax.legend(frameon=False, fontsize=SMALL_PT, ncol=3)
    ax2.axhline(0, color="black", lw=0.6)
    ax2.set_ylabel("minus fp32")
    ax2.set_xlabel("iteration")
    top = max(abs(a - b) for name, losses in curves.items() for a, b in zip(losses, ref))
    ax2.set_ylim(-1.2 * top - 1e-9, 1.2 * top + 1e-9)
    return fig


def bytes_per_param(rows: list[dict]):
    """Bytes per weight element: one bar per format/recipe, the scales' share on top.
    ``rows``: {"name", "data", "scales"} in bytes per element."""
    fig, ax = new(3.9, 0.42 * len(rows) + 1.0)       # + the bar names at the left: <= 5.1 in
    for i, r in enumerate(rows):
        ax.barh(i, r["data"], color="#1f5fa8", label="elements" if i == 0 else None)
        ax.barh(i, r["scales"], left=r["data"], color="#e07b00", label="scales" if i == 0 else None)
        total = r["data"] + r["scales"]
        ax.text(total + 0.05, i, f"{total:.4g} B", va="center", fontsize=SMALL_PT)
    ax.set_yticks(range(len(rows)), [r["name"] for r in rows])
    ax.set_ylim(len(rows) - 0.5, -0.5)
    ax.set_xlim(0, max(r["data"] + r["scales"] for r in rows) * 1.35)
    ax.set_xlabel("bytes per weight element")
    ax.legend(frameon=False, fontsize=SMALL_PT, loc="lower right")
    return fig


def block_error(x, q, tile=(1, 128)):
    """Mean relative error |deq - x| / |x| of ``q`` (a Quantized of x) over each ``tile`` of x, its
    zeros left out -> [rows / tile_m, cols / tile_n] (the chapter's "mean relative error", per tile)."""
    import torch
    x = x.float()
    nz = x != 0
    rel = torch.where(nz, (q.dequantize() - x).abs() / torch.where(nz, x.abs(), torch.ones_like(x)), 0.0)
    bm, bn = tile
    m, k = x.shape
    per = lambda t: t.reshape(m // bm, bm, k // bn, bn).sum(dim=(1, 3))  # noqa: E731 - one sum per tile
    return per(rel) / per(nz.float()).clamp_min(1.0)


def block_errors(errors: dict, outlier: int | None = None):
    """The relative error of each 1x128 tile (row-major tile index on x) under each recipe, log
    scale; ``errors``: {recipe: [tiles] tensor} (``block_error``); ``outlier``: the tile to mark."""
    fig, ax = new(5.0, 3.0)
    for name, err in errors.items():
        e = err.flatten().clamp_min(1e-6)
        colour = COLOURS["blockwise" if name.startswith("blockwise") else name]
        ax.semilogy(range(e.numel()), e.tolist(), marker="o", ms=3.5, lw=0.6, color=colour, label=name)
    if outlier is not None:                                   # the empty band between the two lines
        top = max(float(err.flatten()[outlier]) for err in errors.values())
        ax.annotate("the outlier's tile", (outlier, top), xytext=(0.02, 0.5), textcoords="axes fraction",
                    fontsize=SMALL_PT, arrowprops=dict(arrowstyle="->", lw=0.8))
    ax.set_ylim(0.005, 2.0)
    ax.set_yticks([0.01, 0.1, 1.0], ["0.01", "0.1", "1"])     # plain labels: a phone cannot read 10^-2
    ax.set_yticks([], minor=True)
    ax.set_xlabel("1x128 tile (row-major)")
    ax.set_ylabel("mean relative error")
    ax.legend(frameon=False, fontsize=SMALL_PT, loc="center right")
    return fig


def log2_floor(x: float) -> int:
    return math.floor(math.log2(x))

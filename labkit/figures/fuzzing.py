"""The figure of the chapter "Finding the bug nobody chose": the fuzz loop, drawn from labkit.fuzz
itself (the driver's defaults: the largest world and the iterations per layout) and from the planted
bugs' budgets (data/fuzz_bug_budgets.json: per bug of ``labkit.debug.composition.NAMES`` and seed,
the layout that found it, and how many were drawn and run), so its counts are the stored runs'.
"""
from __future__ import annotations

from .style import SMALL_PT, new

COLOURS = {"step": "#4c72b0", "refused": "#8c8c8c", "pass": "#55a868", "finding": "#c44e52"}


def budgets() -> dict:
    """data/fuzz_bug_budgets.json: {"budget", "runs": {"bug/seed": {found_at, drawn, run, seconds}}}."""
    import json

    from ..data import DATA_DIR
    return json.loads((DATA_DIR / "fuzz_bug_budgets.json").read_text())


def per_bug(data: dict) -> list[dict]:
    """Per planted bug, in ``NAMES`` order: seeds run, seeds that found it, the median layout that did."""
    from statistics import median

    from ..debug.composition import NAMES
    out = []
    for name in NAMES:
        runs = [r for key, r in data["runs"].items() if key.rpartition("/")[0] == name]
        found = sorted(r["found_at"] for r in runs if r["found_at"] is not None)
        out.append({"name": name, "seeds": len(runs), "found": len(found),
                    "median": median(found) if found else None})
    return out


def fig_fuzz_loop(data: dict | None = None):
    """Top to bottom: draw a layout; the rule book refuses it by a named rule (free: draw again) or
    it runs on gloo ranks; the oracle compares it with one device (pass: draw again); a finding is
    shrunk while it still fails alike, and the smallest layout is named. Beside the arrows, how
    many of the stored runs' layouts took each way; below, each planted bug's budget."""
    import inspect

    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

    from ..fuzz import fuzz
    data = budgets() if data is None else data
    defaults = {k: p.default for k, p in inspect.signature(fuzz).parameters.items()}
    drawn = sum(r["drawn"] for r in data["runs"].values())
    ran = sum(r["run"] for r in data["runs"].values())
    bugs = per_bug(data)
    width, pitch, h = 4.8, 0.62, 0.42     # data units are inches (+ 0.1 in of SVG padding each side)
    steps = [("draw a layout (Hypothesis, a seed)", "every axis and knob, world <= "
              f"{defaults['max_world']}"),
             ("the rule book", "config.check; native, Megatron options"),
             (f"run {defaults['steps']} iterations", "on gloo ranks, gradients captured"),
             ("judge against one device", "every loss and gradient; bytes vs calc"),
             ("shrink", "one step simpler while it fails alike"),
             ("name the smallest layout", "JSON, one-line command, diverge report")]
    top = len(steps) * pitch + 0.15
    height = top + 0.3 + 0.2 * (len(bugs) + 1)
    fig, ax = new(width, height)
    x0, w = 0.05, 3.1

    def arrow(a, b, colour="#555555", **kw):
        ax.add_patch(FancyArrowPatch(a, b, arrowstyle="-|>", mutation_scale=10, color=colour, lw=1.1,
                                     shrinkA=0, shrinkB=0, **kw))

    for i, (title, what) in enumerate(steps):
        y = i * pitch
        colour = COLOURS["finding"] if i >= 4 else COLOURS["step"]
        ax.add_patch(FancyBboxPatch((x0, y), w, h, boxstyle="round,pad=0,rounding_size=0.06", fc="white",
                                    ec=colour, lw=1.4))
        ax.text(x0 + 0.08, y + 0.13, title, va="center", fontweight="bold", fontsize=SMALL_PT, color=colour)
        ax.text(x0 + 0.08, y + 0.31, what, va="center", fontsize=SMALL_PT)
        if i:
            arrow((x0 + 0.4, y - pitch + h), (x0 + 0.4, y))
    # the two ways back to the top: refused (free) and passed
    right = x0 + w
    for i, xr, colour, label in ((1, 4.6, COLOURS["refused"], f"refused by a rule:\n{drawn - ran:,} of {drawn:,}"),
                                 (3, 4.74, COLOURS["pass"], "passed:\ndraw again")):
        y = i * pitch + h / 2
        ax.plot([right, xr, xr], [y, y, h / 2], color=colour, lw=1.1)
        arrow((xr, h / 2), (right, h / 2), colour)
        ax.text(right + 0.08, y + 0.05, label, va="top", fontsize=SMALL_PT, color=colour)
    ax.text(x0 + 0.5, 3 * pitch + h + 0.1, "a finding", va="center", fontsize=SMALL_PT, color=COLOURS["finding"])
    y = 4 * pitch                                     # shrink: a candidate that still fails is kept
    ax.plot([right, right + 0.2, right + 0.2], [y + 0.31, y + 0.31, y + 0.11], color=COLOURS["finding"], lw=1.1)
    arrow((right + 0.2, y + 0.11), (right, y + 0.11), COLOURS["finding"])
    ax.text(right + 0.28, y + 0.21, "fails alike:\nkeep it", va="center", fontsize=SMALL_PT,
            color=COLOURS["finding"])
    _bug_table(ax, bugs, data["budget"], x0, top + 0.1, width - 0.05)
    ax.set_xlim(0, width)
    ax.set_ylim(height, -0.05)
    ax.axis("off")
    fig.subplots_adjust(0, 0, 1, 1)
    return fig


def _bug_table(ax, bugs: list, budget: int, x0: float, y: float, right: float) -> None:
    """Below the loop: each planted bug, how many seeds found it within ``budget``, and when."""
    ax.text(x0, y, "planted bug", va="top", fontsize=SMALL_PT, fontweight="bold")
    ax.text(right, y, f"found ({budget} layouts per seed)", va="top", ha="right",
            fontsize=SMALL_PT, fontweight="bold")
    for j, b in enumerate(bugs, 1):
        when = f", median {b['median']:g}" if b["found"] else ""
        ax.text(x0, y + 0.2 * j, b["name"], va="top", fontsize=SMALL_PT, family="DejaVu Sans Mono")
        ax.text(right, y + 0.2 * j, f"{b['found']} of {b['seeds']} seeds{when}", va="top", ha="right",
                fontsize=SMALL_PT)

"""The figure of the chapter "One layout, three implementations": one layout, three ways to run it,
one judge. Drawn from labkit's own objects: the implementations and the layouts each is judged on
(``labkit.megatron.compare.CHAPTER``, ``labkit.native.compare.LAYOUTS``), Megatron's named refusals
(``labkit.megatron.RULES``) and the record the chapter prints (data/megatron_chapter.json: per layout
and implementation, the largest loss and gradient difference from the one-device run and the bytes).
"""
from __future__ import annotations

from .style import SMALL_PT, new

COLOURS = {"labkit": "#4c72b0", "native": "#dd8452", "megatron": "#55a868", "judge": "#333333"}


def record() -> dict:
    """data/megatron_chapter.json: {layout: {implementation: {losses, loss_diff, grad_diff, bytes_per_step}}}."""
    import json

    from ..data import DATA_DIR
    return json.loads((DATA_DIR / "megatron_chapter.json").read_text())


def implementations(rec: dict | None = None) -> list[dict]:
    """The three implementations, each with the code that runs it, what it is built from and the
    layouts it is judged on (the record's rows for labkit and Megatron-Core, the native chapter's)."""
    from ..megatron import RULES
    from ..megatron.compare import CHAPTER
    from ..megatron.options import MEGATRON_CORE_VERSION
    from ..native.compare import LAYOUTS
    rec = record() if rec is None else rec
    rows = {impl: sum(impl in by_impl for by_impl in rec.values()) for impl in ("labkit", "megatron")}
    if set(rec) != {lay.name for lay in CHAPTER}:
        raise ValueError(f"the record's layouts {sorted(rec)} are not the chapter's {[lay.name for lay in CHAPTER]}")
    return [
        {"key": "labkit", "title": "labkit", "code": "labkit.parallelize",
         "built": "the course's own\nTP, PP, DP, ZeRO",
         "judged": f"{rows['labkit']} layouts here,\nand all its own tests"},
        {"key": "native", "title": "PyTorch native", "code": "labkit.native",
         "built": "FSDP2, DTensor,\npipelining",
         "judged": f"{len(LAYOUTS)} layouts in\nits chapter"},
        {"key": "megatron", "title": "Megatron-Core", "code": "labkit.megatron",
         "built": f"{MEGATRON_CORE_VERSION}: GPTModel,\nDDP, schedules",
         "judged": f"{rows['megatron']} layouts here;\n{len(RULES)} named refusals"},
    ]


def fig_three_implementations(rec: dict | None = None):
    """Top: one layout (a TrainConfig). Middle: the three implementations that run it, with the code
    and the layouts each is judged on. Bottom: the judge, the one-device float64 loop for the losses
    and every gradient, labkit.calc for the bytes; under it the record's largest differences."""
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch
    rec = record() if rec is None else rec
    impls = implementations(rec)
    width, height = 4.8, 4.3           # data units are inches (+ 0.1 in of SVG padding each side)
    fig, ax = new(width, height)

    def box(x, y, w, h, colour, fill=False):
        ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0,rounding_size=0.06",
                                    fc=colour if fill else "white", ec=colour, lw=1.4))

    def arrow(x0, y0, x1, y1, colour="#555555"):
        ax.add_patch(FancyArrowPatch((x0, y0), (x1, y1), arrowstyle="-|>", mutation_scale=10,
                                     color=colour, lw=1.1, shrinkA=0, shrinkB=0))

    box(0.6, 0.05, 3.6, 0.5, COLOURS["judge"])       # the layout
    ax.text(2.4, 0.2, "one layout: a TrainConfig", ha="center", va="center", fontweight="bold")
    ax.text(2.4, 0.42, "in Megatron-LM's names", ha="center", va="center", fontsize=SMALL_PT)
    w, gap, top = 1.5, 0.1, 0.95
    for i, im in enumerate(impls):
        x, c = 0.05 + i * (w + gap), COLOURS[im["key"]]
        arrow(2.4, 0.55, x + w / 2, top)
        box(x, top, w, 0.36, c, fill=True)
        ax.text(x + w / 2, top + 0.18, im["title"], ha="center", va="center", color="white",
                fontsize=SMALL_PT, fontweight="bold")
        box(x, top + 0.36, w, 1.1, c)
        ax.text(x + 0.08, top + 0.5, im["code"], va="center", fontsize=SMALL_PT)
        ax.text(x + 0.08, top + 0.68, im["built"], va="top", fontsize=SMALL_PT)
        ax.text(x + 0.08, top + 1.42, im["judged"], va="bottom", fontsize=SMALL_PT, color=c)
        ax.plot([x + w / 2] * 2, [top + 1.46, 2.6], color=c, lw=1.1)
    centres = [0.05 + i * (w + gap) + w / 2 for i in range(len(impls))]
    ax.plot([centres[0], centres[-1]], [2.6, 2.6], color="#555555", lw=1.1)   # every run goes to both judges
    arrow(1.175, 2.6, 1.175, 2.8)
    arrow(3.6, 2.6, 3.6, 2.8)
    box(0.05, 2.8, 2.25, 0.9, COLOURS["judge"])
    ax.text(0.15, 2.9, "labkit.reference", va="top", fontweight="bold", family="DejaVu Sans Mono",
            fontsize=SMALL_PT)
    ax.text(0.15, 3.12, "one device, float64:\nevery loss, every\ngradient by its name", va="top", fontsize=SMALL_PT)
    box(2.4, 2.8, 2.35, 0.9, COLOURS["judge"])
    ax.text(2.5, 2.9, "labkit.calc", va="top", fontweight="bold", family="DejaVu Sans Mono", fontsize=SMALL_PT)
    ax.text(2.5, 3.12, "the bytes each\ncollective moves,\nper rank and step", va="top", fontsize=SMALL_PT)
    loss = max(r["loss_diff"] for by in rec.values() for r in by.values())
    grad = max(r["grad_diff"] for by in rec.values() for r in by.values())
    n = sum(len(by) for by in rec.values())
    ax.text(0.05, 3.82, f"recorded, {n} runs: losses within {loss:.0e},\ngradients within {grad:.0e} "
            f"of one device", va="top", fontsize=SMALL_PT)
    ax.set_xlim(0, width)
    ax.set_ylim(height, 0)
    ax.axis("off")
    fig.subplots_adjust(0, 0, 1, 1)
    return fig

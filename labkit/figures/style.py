"""One style for the book's figures: vector, deterministic, legible on a phone.

Arithmetic behind the sizes: matplotlib writes an SVG ``W`` inches wide as ``72 W`` pt =
``96 W`` CSS px. The book's content column is about :data:`PHONE_COLUMN_PX` wide on a 390 px
screen, so a figure is scaled to ``min(96 W, 350)`` px there, and a label of ``f`` pt shows at
``f * min(96 W, 350) / (72 W)`` CSS px: at ``W`` = 5 in, a 9.5 pt label shows at 9.2 px.
"""
from __future__ import annotations

import io
import re
from contextlib import contextmanager

MIN_LABEL_PX = 9.0        # the smallest label a reader must be able to read, in CSS px
PHONE_COLUMN_PX = 350.0   # content width of the book at a 390 px viewport (measured in Chromium)
MAX_WIDTH_IN = 5.0        # widest figure: labels of FONT_PT still >= MIN_LABEL_PX on a phone
FONT_PT = 10.0            # base font size; ticks and annotations use SMALL_PT
SMALL_PT = 9.5

RC = {
    "svg.fonttype": "none",          # real <text>: selectable, searchable, checkable
    "svg.hashsalt": "labkit",        # deterministic ids: the same figure gives the same bytes
    "font.family": "DejaVu Sans",
    "font.size": FONT_PT,
    "axes.titlesize": FONT_PT,
    "axes.labelsize": FONT_PT,
    "xtick.labelsize": SMALL_PT,
    "ytick.labelsize": SMALL_PT,
    "legend.fontsize": SMALL_PT,
    "figure.dpi": 96,
    "axes.spines.top": False,
    "axes.spines.right": False,
}


@contextmanager
def rc():
    """The house style as a matplotlib rc context."""
    import matplotlib as mpl
    with mpl.rc_context(RC):
        yield


def new(width: float = MAX_WIDTH_IN, height: float = 3.0, nrows: int = 1, ncols: int = 1, **kw):
    """``plt.subplots`` in the house style; refuses a figure wider than a phone can show."""
    if not 0 < width <= MAX_WIDTH_IN:
        raise ValueError(f"figure width {width} in: must be in (0, {MAX_WIDTH_IN}] so that labels "
                         f"stay >= {MIN_LABEL_PX} px on a 390 px screen")
    import matplotlib.pyplot as plt
    with rc():
        fig, ax = plt.subplots(nrows, ncols, figsize=(width, height), **kw)
    fig._labkit_rc = dict(RC)   # re-applied when the figure is saved (rc contexts do not travel)
    return fig, ax


def svg(fig) -> str:
    """The figure as deterministic SVG text (no date, fixed ids, text as text)."""
    import matplotlib as mpl
    buf = io.StringIO()
    with mpl.rc_context(RC):
        fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None})
    return buf.getvalue()


class _SVG:
    """What a notebook cell returns to show an SVG (myst-nb renders ``image/svg+xml``)."""

    def __init__(self, text: str):
        self.text = text

    def _repr_svg_(self) -> str:
        return self.text

    def __repr__(self) -> str:          # the text/plain beside the SVG: stable, no address
        return "<SVG figure>"


def show(fig):
    """Close ``fig`` (no duplicate PNG from the inline backend) and return it as SVG output."""
    import matplotlib.pyplot as plt
    text = svg(fig)
    plt.close(fig)
    return _SVG(text)


_PX = {"pt": 4 / 3, "px": 1.0, "": 1.0, "in": 96.0}


def smallest_label_px(svg_text: str, column_px: float = PHONE_COLUMN_PX) -> float:
    """Smallest label of an SVG as shown in a ``column_px`` wide column, in CSS px.

    The SVG is drawn at its ``width``, scaled down to the column when wider (never up); font sizes
    are in the units of its ``viewBox`` (matplotlib writes ``font: 9.5px`` in a viewBox measured in
    pt), so each is multiplied by rendered px per viewBox unit. Returns ``inf`` for no text.
    """
    m = re.search(r'<svg[^>]*\swidth="([\d.]+)(pt|px|in)?"', svg_text)
    vb = re.search(r'viewBox="[-\d.]+ [-\d.]+ ([\d.]+) [\d.]+"', svg_text)
    if not m:
        raise ValueError("not an SVG with a width attribute")
    width_px = float(m.group(1)) * _PX[m.group(2) or ""]
    per_unit = min(width_px, column_px) / (float(vb.group(1)) if vb else width_px)
    sizes = [float(v) for v in re.findall(r'font(?:-size)?[:=]\s*"?(?:[a-z]+ )*([\d.]+)(?:px)?', svg_text)]
    return min(sizes) * per_unit if sizes else float("inf")

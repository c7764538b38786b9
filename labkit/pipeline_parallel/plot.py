"""Draw a pipeline timeline: ranks x time, one box per action (chapters "Pipeline parallelism",
"Interleaved pipeline").

The same function draws a simulated run (``labkit.pipeline_parallel.simulate``) and a measured
one (``labkit.pipeline_parallel.executor.run_schedule`` records the same ``Event`` objects with
seconds), so the book puts them side by side. Forward boxes are blue, backward green,
weight-gradient (W) grey; later model chunks are drawn in lighter shades; a box wide enough to
hold its label carries its microbatch number.

Panels that share their x axis (``plt.subplots(n, 1, sharex=True)``) are never clipped: each
call records its own span on its Axes and sets the shared limit to the widest span drawn so far,
so the longer of two schedules is shown whole (a per-panel ``set_xlim(0, span)`` on shared axes
used to cut it).
"""
from __future__ import annotations

import matplotlib.pyplot as plt

from .simulate import Event, Simulation, simulate

# Colour per kind, one shade per chunk (chunk 0 darkest).
SHADES = {"F": ["#1f5fa8", "#5b9bd5", "#9dc3e6", "#c9ddf0"],
          "B": ["#2e7d32", "#66bb6a", "#a5d6a7", "#d0ecd1"],
          "W": ["#616161", "#9e9e9e", "#bdbdbd", "#e0e0e0"]}
NAMES = {"F": "forward", "B": "backward", "W": "weight grad"}


def _events(data) -> list[Event]:
    if isinstance(data, Simulation):
        return data.timeline
    if data and isinstance(data[0], Event):
        return list(data)
    return simulate(data).timeline  # a schedule: simulate with the default costs


def span_of(events) -> tuple[float, float]:
    """(first start, last end) of a timeline: the x-range a drawing must cover."""
    return min(e.start for e in events), max(e.end for e in events)


def shared_span(ax) -> float:
    """The widest span :func:`render` drew on ``ax`` or on any Axes sharing its x axis."""
    siblings = ax.get_shared_x_axes().get_siblings(ax)
    return max(getattr(a, "_labkit_span", 0.0) for a in siblings)


def legend_handles(kinds="FB"):
    """(handles, labels) for a legend of the action kinds, e.g. one legend for several panels."""
    return ([plt.Rectangle((0, 0), 1, 1, color=SHADES[k][0]) for k in kinds],
            [NAMES[k] for k in kinds])


def render(data, title: str | None = None, ax=None, unit: str = "time units", labels: bool = True,
           legend: bool = True, fontsize: float | None = None):
    """Draw ``data`` (a Simulation, a list of Events, or a schedule) and return the Figure.

    ``ax``: draw into an existing Axes (e.g. one of two stacked panels); ``unit`` labels the x
    axis; ``fontsize`` of the box labels, legend and title (default: the tick label size of the
    current style). Box labels are drawn only where they fit inside their box.
    """
    events = _events(data)
    if not events:
        raise ValueError("nothing to draw: the timeline has no events")
    size = fontsize or plt.rcParams["xtick.labelsize"]
    size = size if isinstance(size, (int, float)) else 9.5
    p = 1 + max(e.rank for e in events)
    fig = None
    if ax is None:
        fig, ax = plt.subplots(figsize=(10, 0.45 * p + 1.0))
    t0, t1 = span_of(events)
    span = t1 - t0
    ax._labkit_span = span
    right = shared_span(ax)
    ax.set_xlim(0, right)             # shared with the other panels: the widest span wins
    # width of one time unit in points, to label only the boxes a digit fits in
    box = ax.get_position()
    pt_per_unit = box.width * ax.figure.get_figwidth() * 72 / right
    for e in events:
        shades = SHADES[e.action.kind]
        colour = shades[min(e.action.chunk, len(shades) - 1)]
        width = e.end - e.start
        ax.broken_barh([(e.start - t0, width)], (e.rank - 0.4, 0.8), facecolors=colour,
                       edgecolors="white", linewidth=0.6)
        text = str(e.action.microbatch)
        if labels and width * pt_per_unit >= 0.65 * size * len(text) + 2:
            dark = e.action.chunk == 0 or e.action.kind != "F"
            ax.text(e.start - t0 + width / 2, e.rank, text, ha="center", va="center",
                    fontsize=size, color="white" if dark else "black")
    ax.set_yticks(range(p), [f"rank {r}" for r in range(p)])
    ax.set_ylim(p - 0.5, -0.5)  # rank 0 on top, as in the papers' figures
    ax.set_xlabel(unit)
    if legend:
        kinds = sorted({e.action.kind for e in events}, key="FBW".index)
        ax.legend(*legend_handles(kinds), loc="lower right", fontsize=size, ncol=len(kinds),
                  bbox_to_anchor=(1.0, 1.0), frameon=False, borderaxespad=0.1)
    if title:
        ax.set_title(title, fontsize=size, loc="left")
    return fig if fig is not None else ax.figure

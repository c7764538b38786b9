"""Draw a pipeline timeline: ranks x time, one box per action (chapters "Pipeline parallelism",
"Interleaved pipeline").

The same function draws a simulated run (``labkit.pipeline_parallel.simulate``) and a measured
one (``labkit.pipeline_parallel.executor.run_schedule`` records the same ``Event`` objects with
seconds), so
the book puts them side by side. Forward boxes are blue, backward green, weight-gradient (W) grey;
later model chunks are drawn in lighter shades; each box carries its microbatch number.
"""
from __future__ import annotations

import matplotlib.pyplot as plt

from .simulate import Event, Simulation, simulate

# Colour per kind, one shade per chunk (chunk 0 darkest).
SHADES = {"F": ["#1f5fa8", "#5b9bd5", "#9dc3e6", "#c9ddf0"],
          "B": ["#2e7d32", "#66bb6a", "#a5d6a7", "#d0ecd1"],
          "W": ["#616161", "#9e9e9e", "#bdbdbd", "#e0e0e0"]}


def _events(data) -> list[Event]:
    if isinstance(data, Simulation):
        return data.timeline
    if data and isinstance(data[0], Event):
        return list(data)
    return simulate(data).timeline  # a schedule: simulate with the default costs


def render(data, title: str | None = None, ax=None, unit: str = "time units", labels: bool = True):
    """Draw ``data`` (a Simulation, a list of Events, or a schedule) and return the Figure.

    ``ax``: draw into an existing Axes (e.g. one of two side by side); ``unit`` labels the x axis.
    """
    events = _events(data)
    if not events:
        raise ValueError("nothing to draw: the timeline has no events")
    p = 1 + max(e.rank for e in events)
    fig = None
    if ax is None:
        fig, ax = plt.subplots(figsize=(10, 0.45 * p + 1.0))
    t0 = min(e.start for e in events)
    span = max(e.end for e in events) - t0
    for e in events:
        shades = SHADES[e.action.kind]
        colour = shades[min(e.action.chunk, len(shades) - 1)]
        width = e.end - e.start
        ax.broken_barh([(e.start - t0, width)], (e.rank - 0.4, 0.8), facecolors=colour,
                       edgecolors="white", linewidth=0.6)
        if labels and width > span / 90:  # label only boxes wide enough to read
            dark = e.action.chunk == 0 or e.action.kind != "F"
            ax.text(e.start - t0 + width / 2, e.rank, str(e.action.microbatch), ha="center",
                    va="center", fontsize=7, color="white" if dark else "black")
    ax.set_yticks(range(p), [f"rank {r}" for r in range(p)])
    ax.set_ylim(p - 0.5, -0.5)  # rank 0 on top, as in the papers' figures
    ax.set_xlim(0, span)
    ax.set_xlabel(unit)
    kinds = sorted({e.action.kind for e in events}, key="FBW".index)
    names = {"F": "forward", "B": "backward", "W": "weight grad"}
    ax.legend(handles=[plt.Rectangle((0, 0), 1, 1, color=SHADES[k][0]) for k in kinds],
              labels=[names[k] for k in kinds], loc="upper right", fontsize=7, ncol=len(kinds),
              bbox_to_anchor=(1.0, 1.25 if p < 3 else 1.15), frameon=False)
    if title:
        ax.set_title(title, fontsize=9, loc="left")
    return fig if fig is not None else ax.figure

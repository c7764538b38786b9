"""The figure of the section "The slow rank": each rank's steps and collectives on one clock.

    timeline_figure(records, iterations=(1, 2))   from the record of one run (StepClock's, per rank)

Per rank, one row: the data wait (grey), the time computing (teal) and the time inside labkit's
calls (red: from entering a collective to leaving it), per step; a black tick where the rank
entered its first collective of the step; a white gap where a step begins. The steps end
together, the ticks do not.
"""
from __future__ import annotations

from .. import figures

DATA, COMPUTE, COMM = "#8d96a3", "#00798c", "#d1495b"


def timeline_figure(records: list[dict], iterations=(1, 2)):
    fig, ax = figures.new(4.6, 0.8 + 0.45 * len(records))    # + the rank names: <= 5.1 in
    t0 = min(b for rec in records for it, b, _, _ in rec["steps"] if it == iterations[0])
    for rec in records:
        y = len(records) - 1 - rec["rank"]
        for it, begin, ready, end in rec["steps"]:
            if it not in iterations:
                continue
            ax.broken_barh([(begin - t0, ready - begin)], (y - 0.3, 0.6), color=DATA)
            ax.broken_barh([(ready - t0, end - ready)], (y - 0.3, 0.6), color=COMPUTE)
            calls = sorted((c[4], c[5]) for c in rec["calls"] if begin <= c[4] <= end)
            ax.broken_barh([(a - t0, b - a) for a, b in calls], (y - 0.3, 0.6), color=COMM)
            if calls:
                ax.plot([calls[0][0] - t0] * 2, [y - 0.42, y + 0.42], color="black", lw=1.5)
            ax.plot([begin - t0] * 2, [y - 0.3, y + 0.3], color="white", lw=2)      # where the step begins
    ax.set_yticks(range(len(records)))
    ax.set_yticklabels([f"rank {len(records) - 1 - i}" for i in range(len(records))])
    ax.set_xlabel("seconds")
    ax.set_ylim(-0.6, len(records) - 0.4)
    for color, label in ((DATA, "data"), (COMPUTE, "compute"), (COMM, "in a collective")):
        ax.bar(0, 0, color=color, label=label)
    ax.plot([], [], color="black", lw=1.5, label="first entry")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.32), ncol=2, frameon=False)   # 4 in a row: wider than a phone
    return figures.show(fig)

"""The figure of the section "Ranks that die" (chapter "When training goes wrong"), drawn from a
run of tests/bench_restart.py (data/restart_bench.json, its ``sweep``: the same 5 faults for each
save interval):

    goodput_sweep_figure(sweep)   left: wall time by cause per save interval (useful steps, save
                                  blocking, recomputed steps, restarts); right: goodput measured
                                  against labkit.calc.goodput fed the run's own numbers

House style: ``labkit.figures.new`` / ``show``.
"""
from __future__ import annotations

from .. import figures

CAUSES = [("useful_s", "useful steps", "#00798c"), ("save_blocking_s", "save blocking", "#edae49"),
          ("recomputed_s", "recomputed steps", "#d1495b"), ("restart_s", "restarts", "#8d96a3")]


def goodput_sweep_figure(sweep: dict):
    """Two panels over the save interval (iterations): seconds by cause, and goodput (%)."""
    rows = sweep["rows"]
    ks = [str(r["save_interval"]) for r in rows]
    fig, (left, right) = figures.new(4.8, 2.8, ncols=2)
    bottom = [0.0] * len(rows)
    for key, label, color in CAUSES:
        vals = [r["measured"][key] for r in rows]
        left.bar(ks, vals, bottom=bottom, color=color, label=label, width=0.7)
        bottom = [b + v for b, v in zip(bottom, vals)]
    left.set_xlabel("save interval (iterations)")
    left.set_ylabel("seconds after start-up")
    left.legend(frameon=False, fontsize=figures.style.SMALL_PT, loc="upper center", ncol=1)
    left.set_ylim(0, max(bottom) * 1.75)
    measured = [100 * r["measured"]["goodput_after_startup"] for r in rows]
    model = [100 * r["model"]["goodput"] for r in rows]
    right.plot(ks, measured, "o-", color="#00798c", label="measured")
    right.plot(ks, model, "s--", color="#2e4057", label="calc.goodput")
    best = max(range(len(rows)), key=lambda i: measured[i])
    right.annotate("best", (best, measured[best]), xytext=(0, 8), textcoords="offset points",
                   ha="center", fontsize=figures.style.SMALL_PT, color="#00798c")
    right.set_xlabel("save interval (iterations)")
    right.set_ylabel("goodput (%)")
    right.set_ylim(0, max(measured + model) * 1.3)
    right.legend(frameon=False, loc="lower center")
    fig.tight_layout()
    return figures.show(fig)

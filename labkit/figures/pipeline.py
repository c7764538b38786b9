"""Figures of the chapters "Pipeline parallelism" and "Interleaved pipeline", drawn from the
schedules (``pipeline_parallel.schedules``), their simulation, labkit.calc and measured runs.

    fig_timelines(panels)        stacked timelines on one time axis (never clipped)
    fig_in_flight(p, m)          microbatches whose activations each rank holds, over time
    fig_bubble_vs_m(ps)          simulated bubble against (p-1)/(v m)
    fig_virtual_stages(L, p, n)  which layers each rank holds, interleaved
    fig_latency(p, m, v)         1F1B vs interleaved step time as the p2p latency grows
    fig_stage_memory(parts, measured)   memory per pipeline stage: labkit.calc vs nvidia-smi
"""
from __future__ import annotations

from ..pipeline_parallel import schedules as S
from ..pipeline_parallel.plot import legend_handles, render, span_of
from ..pipeline_parallel.simulate import simulate
from .style import new

RANK_COLORS = ["#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860", "#da8bc3", "#8c8c8c"]


def _events(data):
    return data.timeline if hasattr(data, "timeline") else list(data)


def fig_timelines(panels=None, unit: str = "time units", width: float = 5.0):
    """``panels``: [(title, Simulation or measured events)], drawn top to bottom on one x-range
    that covers every event of every panel. Default: GPipe and 1F1B, p = 4, m = 8."""
    if panels is None:
        panels = []
        for name, sched in (("GPipe", S.gpipe(4, 8)), ("1F1B", S.one_f_one_b(4, 8))):
            sim = simulate(sched)
            panels.append((f"{name}: time {sim.makespan:g}, bubble {sim.bubble_fraction:.3f}", sim))
    p = max(1 + max(e.rank for e in _events(d)) for _, d in panels)
    fig, axes = new(width, len(panels) * (0.3 * p + 0.75) + 0.5, nrows=len(panels), sharex=True)
    axes = list(axes) if len(panels) > 1 else [axes]
    spans = [span_of(_events(d)) for _, d in panels]
    right = max(t1 - t0 for t0, t1 in spans)
    for ax in axes:
        ax._labkit_span = right                 # label boxes against the final x-range
    for ax, (title, data) in zip(axes, panels):
        render(data, title=title, ax=ax, unit=unit, legend=False)
        ax.set_xlabel("")
    axes[-1].set_xlabel(unit)
    kinds = sorted({e.action.kind for _, d in panels for e in _events(d)}, key="FBW".index)
    fig.legend(*legend_handles(kinds), loc="lower center", ncol=len(kinds), frameon=False,
               bbox_to_anchor=(0.5, 1.0))
    fig.tight_layout()
    return fig


def in_flight_curve(events, rank: int):
    """(times, held) step curve: microbatch-chunks whose activations ``rank`` holds over time
    (from the start of a forward to the end of the backward, or of W when there is one)."""
    last = "W" if any(e.action.kind == "W" for e in events) else "B"
    deltas = {}
    for e in events:
        if e.rank == rank and e.action.kind in ("F", last):
            t = e.start if e.action.kind == "F" else e.end
            deltas[t] = deltas.get(t, 0) + (1 if e.action.kind == "F" else -1)
    times, held = [0.0], [0]
    for t in sorted(deltas):
        times.append(t), held.append(held[-1] + deltas[t])
    return times, held


def fig_in_flight(p: int = 4, m: int = 8):
    """Activations held per rank over time, GPipe (left) vs 1F1B (right), from the simulation."""
    fig, axes = new(5.0, 2.6, ncols=2, sharey=True)
    for ax, (name, sched) in zip(axes, (("GPipe", S.gpipe(p, m)), ("1F1B", S.one_f_one_b(p, m)))):
        sim = simulate(sched)
        for r in range(p):
            t, held = in_flight_curve(sim.timeline, r)
            ax.step(t, held, where="post", color=RANK_COLORS[r], label=f"rank {r}", lw=1.6)
        ax.set_title(f"{name}, p={p}, m={m}", loc="left")
        ax.set_xlabel("time units")
        ax.set_xlim(0, sim.makespan)
    axes[0].set_ylabel("microbatches held")
    axes[0].set_yticks(range(0, m + 1, 2))
    fig.legend(*axes[0].get_legend_handles_labels(), loc="lower center", ncol=p, frameon=False,
               bbox_to_anchor=(0.5, 1.0))
    fig.tight_layout()
    return fig


def fig_bubble_vs_m(ps=(2, 4, 8), ms=(1, 2, 4, 8, 16, 32), vs=(1,)):
    """Simulated bubble of 1F1B (v = 1) or the interleaved schedule (v > 1) as circles on the
    curves (p-1)/(v m) of labkit.calc, one curve per (p, v)."""
    from matplotlib.ticker import FuncFormatter, NullFormatter

    from ..calc import bubble_fraction
    fig, ax = new(5.0, 2.8)
    curves = [(p, v) for p in ps for v in vs]
    for (p, v), color in zip(curves, RANK_COLORS):
        ok = [m for m in ms if v == 1 or m % p == 0]          # interleaved: m a multiple of p
        sims = [simulate(S.one_f_one_b(p, m) if v == 1 else S.interleaved(p, v, m)).bubble_fraction
                for m in ok]
        label = f"p = {p}" + (f", v = {v}" if len(vs) > 1 else "")
        ax.plot(ok, [bubble_fraction(p, m, v) for m in ok], color=color, lw=1.2, label=label)
        ax.plot(ok, sims, "o", color=color, ms=5, mfc="none")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log", base=2)
    ax.set_xticks(ms, [str(m) for m in ms])
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _: f"{y:g}"))
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("microbatches m")
    ax.set_ylabel("bubble / busy time")
    # above the axes: inside, the lines run corner to corner and any spot covers one (issue 36, defect 10)
    ax.legend(frameon=False, title="lines (p-1)/(v m), circles simulated", loc="lower center",
              bbox_to_anchor=(0.5, 1.0), ncol=len(curves), columnspacing=1.2, handlelength=1.5)
    fig.tight_layout()
    return fig


def fig_virtual_stages(num_layers: int = 16, p: int = 4, per_virtual: int = 2):
    """Ranks as rows, layers as boxes placed where Megatron puts them (``schedules.stage_of``),
    coloured by chunk; the numbers are the layers, the path of a microbatch is 0 -> L-1."""
    from matplotlib.patches import Rectangle
    v = num_layers // (p * per_virtual)
    fig, ax = new(5.0, 0.42 * p + 0.9)
    shades = ["#1f5fa8", "#9dc3e6", "#2e7d32", "#a5d6a7"]
    for r in range(p):
        for c in range(v):
            stage = S.stage_of(r, c, p)
            for j in range(per_virtual):
                layer = stage * per_virtual + j
                x = c * (per_virtual + 0.5) + j
                ax.add_patch(Rectangle((x, r - 0.4), 0.92, 0.8, color=shades[c % len(shades)]))
                ax.text(x + 0.46, r, str(layer), ha="center", va="center",
                        color="white" if c % 2 == 0 else "black")
    ax.set_xlim(-0.1, v * (per_virtual + 0.5))
    ax.set_ylim(p - 0.5, -0.5)
    ax.set_yticks(range(p), [f"rank {r}" for r in range(p)])
    ax.set_xticks([c * (per_virtual + 0.5) + per_virtual / 2 - 0.04 for c in range(v)],
                  [f"chunk {c}" for c in range(v)])
    ax.tick_params(length=0)
    for side in ("left", "bottom"):
        ax.spines[side].set_visible(False)
    fig.tight_layout()
    return fig


def fig_latency(p: int = 4, m: int = 8, vs=(1, 2, 4), latencies=None):
    """Simulated step time of 1F1B (v = 1) and interleaved schedules as the p2p latency grows
    (forward = 1 per full stage, backward = 2, a chunk 1/v of that)."""
    latencies = latencies or [x / 10 for x in range(0, 21)]
    fig, ax = new(5.0, 2.6)
    for v, color in zip(vs, RANK_COLORS):
        sched = S.one_f_one_b(p, m) if v == 1 else S.interleaved(p, v, m)
        times = [simulate(sched, 1.0 / v, 2.0 / v, comm=c).makespan for c in latencies]
        ax.plot(latencies, times, color=color, label="1F1B" if v == 1 else f"interleaved v={v}")
    ax.set_xlabel("p2p latency per message (forward of a stage = 1)")
    ax.set_ylabel("step time")
    ax.set_title(f"p = {p}, m = {m}", loc="left")
    ax.legend(frameon=False)
    fig.tight_layout()
    return fig


PARTS = (("params", "#4c72b0"), ("grads", "#55a868"), ("optimizer", "#c44e52"),
         ("activations", "#dd8452"))


def fig_stage_memory(rows: list, measured_gib: list, limit_gib: float | None = None):
    """Stacked labkit.calc memory per pipeline stage (``rows`` of ``calc.memory_per_stage``, bytes)
    with the measured GiB of each GPU as a black tick."""
    fig, ax = new(5.0, 2.8)
    gib = 2 ** 30
    for i, row in enumerate(rows):
        bottom = 0.0
        for part, color in PARTS:
            ax.bar(i, row[part] / gib, 0.5, bottom=bottom, color=color,
                   label=part if i == 0 else None)
            bottom += row[part] / gib
        ax.text(i + 0.28, bottom, f"calc {bottom:.1f}", va="center")
        ax.plot([i - 0.32, i + 0.32], [measured_gib[i]] * 2, color="black", lw=2.2,
                label="measured" if i == 0 else None)
        ax.text(i - 0.3, measured_gib[i] + 1.5, f"measured {measured_gib[i]:.1f}", ha="left")
    if limit_gib:
        ax.axhline(limit_gib, color="grey", ls=":", lw=1)
    ax.set_xticks(range(len(rows)), [f"stage {r.get('stage', i)}" for i, r in enumerate(rows)])
    ax.set_xlim(-0.6, len(rows) - 0.1)
    ax.set_ylabel("GiB per GPU")
    ax.set_ylim(0, max(max(measured_gib), max(sum(r[p] for p, _ in PARTS) / gib for r in rows)) * 1.2)
    ax.legend(frameon=False, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.12))
    fig.tight_layout()
    return fig

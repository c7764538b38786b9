"""Figures of the chapter "Memory knobs", drawn from measured runs (``labkit.measure.memory_knobs``)
and ``labkit.calc``. Each function returns a matplotlib Figure in the house style.

* :func:`memory_per_precision`  bytes per parameter each rank held, per precision (measured)
* :func:`fig_recompute`         what one layer keeps for its backward under none / selective / full
* :func:`recompute_tradeoff`    bytes kept and FLOPs per step of each recompute mode
* :func:`live_params`           live parameters through one ZeRO-3 step, whole-model vs per-layer
"""
from __future__ import annotations

from .style import SMALL_PT, new

PARTS = (("params", "#1f5fa8"), ("grads", "#e07b00"), ("optimizer", "#2e7d32"))


def memory_per_precision(rows: list[dict]):
    """Bytes per parameter each rank held, stacked (params, grads, optimizer), one bar per
    configuration; a black tick marks labkit.calc's total. ``rows``: {"config", "params", "grads",
    "optimizer", "calc"} in bytes per parameter."""
    fig, ax = new(4.0, 0.45 * len(rows) + 1.2)      # the tick labels widen it to about 5 in
    for i, r in enumerate(rows):
        left = 0.0
        for part, colour in PARTS:
            ax.barh(i, r[part], left=left, color=colour, label=part if i == 0 else None)
            left += r[part]
        ax.plot([r["calc"]] * 2, [i - 0.42, i + 0.42], color="black", lw=2, label="labkit.calc" if i == 0 else None)
        ax.text(left + 0.3, i, f"{left:g} B", va="center", fontsize=SMALL_PT)
    ax.set_yticks(range(len(rows)), [r["config"] for r in rows])
    ax.set_ylim(len(rows) - 0.5, -0.5)
    ax.set_xlim(0, max(r["params"] + r["grads"] + r["optimizer"] for r in rows) * 1.25)
    ax.set_xlabel("bytes per parameter on one rank (DP 2)")
    ax.legend(frameon=False, fontsize=SMALL_PT, ncol=4, loc="lower center", bbox_to_anchor=(0.45, 1.0))
    return fig


def live_params(timeline: dict):
    """Live parameter bytes at each unit boundary of one ZeRO-3 step (forward then backward):
    whole-model vs per-layer, with one shard + the two largest units dashed."""
    fig, ax = new(5.0, 3.4)
    mib = 2.0 ** 20
    for kind, colour in (("whole-model", "#9e9e9e"), ("per-layer", "#1f5fa8")):
        ys = [b / mib for _, _, b in timeline[kind]]
        xs = [i / (len(ys) - 1) for i in range(len(ys))]       # the step's boundaries, 0 to 1
        ax.step(xs, ys, where="post", color=colour, lw=2, label=f"{kind} ZeRO-3")
    units = timeline["units"]
    shard = sum(s for _, _, s in units)
    two = sum(sorted(full for _, full, _ in units)[-2:])
    ax.axhline((shard + two) / mib, ls="--", color="black", lw=1, label="one shard + two units")
    ax.axhline(shard / mib, ls=":", color="black", lw=1, label="one shard")
    ax.set_xlabel("one step: unit boundaries, forward then backward")
    ax.set_ylabel("live parameters (MiB)")
    ax.set_ylim(0, None)
    ax.set_xticks([0, 0.5, 1], ["start", "", "end"])
    ax.legend(frameon=False, fontsize=SMALL_PT, ncol=2, loc="upper center", bbox_to_anchor=(0.5, -0.22))
    return fig


def recompute_tradeoff(saved: dict, seconds: dict | None = None, flops_ratio: dict | None = None):
    """Left: bytes one layer keeps for its backward, none / selective / full (measured). Right: time
    per training step relative to no recomputation: bars are the analytic FLOPs ratio
    (``flops_ratio``, when given), black dots the measured median step time of each mode over its
    repeated steps with a whisker from the fastest to the slowest step (``seconds``: {mode: [step
    times]}, or one number per mode), each divided by the median of "none": where the whiskers
    overlap, the measured difference is within this machine's noise."""
    import statistics
    fig, (a1, a2) = new(5.0, 2.8, 1, 2)
    modes = ["none", "selective", "full"]
    colours = ["#9e9e9e", "#1f5fa8", "#2e7d32"]
    a1.bar(modes, [saved[m] / 1024 for m in modes], color=colours)
    a1.set_ylabel("saved per layer (KiB)")
    if flops_ratio is not None:
        a2.bar(modes, [flops_ratio[m] for m in modes], color=colours, alpha=0.45 if seconds else 1.0,
               label="FLOPs (analytic)")
        a2.set_ylim(0, max(flops_ratio.values()) * 1.15)
    samples = {m: list(seconds[m]) if isinstance(seconds[m], (list, tuple)) else [seconds[m]]
               for m in modes} if seconds else {}
    base = statistics.median(samples["none"]) if samples else 1.0
    for i, m in enumerate(modes if samples else []):
        r = [x / base for x in samples[m]]
        mid = statistics.median(r)
        a2.errorbar([i], [mid], yerr=[[mid - min(r)], [max(r) - mid]], fmt="o", color="black", ms=4,
                    capsize=3, label="measured (median, min-max)" if i == 0 else None)
    a2.axhline(1.0, color="black", lw=0.8)
    a2.set_ylabel("per step / none")
    if samples and flops_ratio is not None:
        a2.legend(fontsize=SMALL_PT, loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=1, frameon=False)
    for ax in (a1, a2):
        ax.tick_params(axis="x", labelsize=SMALL_PT)
    fig.tight_layout()
    return fig


# What one GPT layer keeps for its backward (Korthikanti et al. 2022, Sec. 4.1; 16-bit values,
# 1-byte dropout masks): (block, tensor, size in their notation, bytes per token, core attention?).
# ``h``: hidden, ``q``/``kv``: query / key-value channels, ``f``: ffn, ``a``: heads, ``s``: sequence.
def layer_tensors(h, q, kv, f, a, s) -> list:
    return [("attention", "layer input", "2sbh", 2 * h, False),
            ("attention", "norm 1 output", "2sbh", 2 * h, False),
            ("attention", "Q, K, V", "6sbh", 2 * (q + 2 * kv), False),
            ("attention", "softmax output", "2as²b", 2 * a * s, True),
            ("attention", "its dropout mask", "as²b", a * s, True),
            ("attention", "dropout output", "2as²b", 2 * a * s, True),
            ("attention", "attention output", "2sbh", 2 * q, False),
            ("attention", "dropout mask", "sbh", h, False),
            ("MLP", "norm 2 input", "2sbh", 2 * h, False),
            ("MLP", "norm 2 output", "2sbh", 2 * h, False),
            ("MLP", "GELU input", "8sbh", 2 * f, False),
            ("MLP", "GELU output", "8sbh", 2 * f, False),
            ("MLP", "dropout mask", "sbh", h, False)]


MODES = (("none", None, "nothing"), ("selective", "selective", "core_attn"), ("full", "full", "the layer"))


def fig_recompute(model_name: str = "gpt3-175b", micro_batch_size: int = 1):
    """Per tensor of one layer, kept by the forward or rerun by the backward, under no, selective and
    full recomputation; the bytes per layer below are labkit.calc's, and the itemization is checked
    against them (``layer_activation_bytes`` with materialized scores, as Korthikanti counts)."""
    from matplotlib.patches import Rectangle

    from .. import calc
    m = calc.model(model_name)
    rows = layer_tensors(m.hidden_size, m.kv_channels * m.num_attention_heads, m.kv_channels * m.query_groups,
                         m.ffn_hidden_size, m.num_attention_heads, m.seq_length)
    sb = m.seq_length * micro_batch_size
    kept = {"none": lambda r: True, "selective": lambda r: not r[4], "full": lambda r: r[1] == "layer input"}
    per_layer = {}
    for name, rec, _ in MODES:
        par = calc.ParallelConfig(micro_batch_size=micro_batch_size, recompute_granularity=rec)
        per_layer[name] = calc.layer_activation_bytes(m, par, attention="math")
        mine = sb * sum(r[3] for r in rows if kept[name](r))
        if abs(mine - per_layer[name]) > 1e-9 * per_layer[name]:
            raise ValueError(f"{name}: the itemized tensors ({mine}) are not labkit.calc's {per_layer[name]}")
    W, pitch, top = 5.0, 0.245, 0.55                   # data units are inches (subplots_adjust below)
    H = top + pitch * (len(rows) + 2) + 0.1
    fig, ax = new(W, H)
    x0, cw = 2.5, 0.83                                 # first mode column, column width
    ax.text(0.32, top - 0.12, "what the forward keeps", va="bottom", fontweight="bold")
    for j, (name, _, _) in enumerate(MODES):
        ax.text(x0 + (j + 0.5) * cw, top - 0.12, name, ha="center", va="bottom", fontweight="bold")
    for i, (block, tensor, size, _, core) in enumerate(rows):
        y = top + i * pitch
        if core:
            ax.add_patch(Rectangle((0.28, y + 0.01), x0 - 0.32, pitch - 0.02, fc="#f6d5d6", ec="none"))
        ax.text(0.32, y + pitch / 2, tensor, va="center")
        ax.text(x0 - 0.08, y + pitch / 2, size, va="center", ha="right")
        for j, (name, _, _) in enumerate(MODES):
            keep = kept[name]((block, tensor, size, 0, core))
            ax.add_patch(Rectangle((x0 + j * cw + 0.05, y + 0.025), cw - 0.1, pitch - 0.05, lw=1,
                                   fc="#c44e52" if keep else "white", ec="#c44e52", ls="-" if keep else "--"))
            ax.text(x0 + (j + 0.5) * cw, y + pitch / 2, "kept" if keep else "rerun", ha="center", va="center",
                    color="white" if keep else "#c44e52")
    for block in dict.fromkeys(r[0] for r in rows):    # the two blocks, labelled down the left edge
        idx = [i for i, r in enumerate(rows) if r[0] == block]
        y0, y1 = top + idx[0] * pitch, top + (idx[-1] + 1) * pitch
        ax.plot([0.22, 0.18, 0.18, 0.22], [y0 + 0.03, y0 + 0.03, y1 - 0.03, y1 - 0.03], color="black", lw=1)
        ax.text(0.1, (y0 + y1) / 2, block, rotation=90, ha="center", va="center")
    foot = top + len(rows) * pitch + 0.05
    ax.text(0.32, foot + pitch / 2, f"GiB per layer ({model_name})", va="center")
    ax.text(0.32, foot + 1.5 * pitch, "the backward reruns", va="center")
    for j, (name, _, reruns) in enumerate(MODES):
        ax.text(x0 + (j + 0.5) * cw, foot + pitch / 2, f"{per_layer[name] / 2**30:.2f}", ha="center", va="center")
        ax.text(x0 + (j + 0.5) * cw, foot + 1.5 * pitch, reruns, ha="center", va="center")
    ax.set_xlim(0, W)
    ax.set_ylim(H, 0)
    ax.axis("off")
    fig.subplots_adjust(0, 0, 1, 1)
    return fig

"""Figures of the chapter "Why parallelism: memory and compute", drawn from labkit.calc.

Each function returns a matplotlib Figure in the book's house style (``labkit.figures.new``): the
notebook shows it with ``labkit.figures.show(fig)``. Every number drawn comes from the calculators
the tests check (``labkit.calc``) or from the stored measurement (``data/``), never typed here.

* :func:`fig_memory_cuts`     one GPU's memory, part by part, and the axes and knobs that shrink each
* :func:`memory_anatomy`      what one GPU holds: weights, gradients, optimizer states, activations
* :func:`activations_by_layout` one layer's activations per layout (Korthikanti et al. 2022, Table 2)
* :func:`zero_stages`         model states per GPU under ZeRO stages 0-3
* :func:`measured_mfu`        MFU of one GPU, measured, beside the paper's range
"""
from __future__ import annotations

from .style import new

GIB = 2 ** 30
PARTS = (("params", "weights", "#4c72b0"), ("grads", "gradients", "#dd8452"),
         ("optimizer", "optimizer states", "#55a868"), ("activations", "activations", "#c44e52"))


def _stacked(ax, rows, labels, limit=None, limit_label=None):
    """Horizontal stacked bars, one per row of {part: bytes}; totals written at the end."""
    for i, row in enumerate(rows):
        left = 0.0
        for key, name, colour in PARTS:
            width = row.get(key, 0.0) / GIB
            if width > 0:
                ax.barh(i, width, left=left, color=colour, label=name if i == 0 else None, height=0.6)
            left += width
        ax.text(left, i, f" {left:,.1f}", va="center", fontsize=9.5)
    ax.set_yticks(range(len(rows)), labels)
    ax.invert_yaxis()
    ax.set_xlabel("GiB per GPU")
    if limit is not None:
        ax.axvline(limit / GIB, color="black", linestyle="--", linewidth=1.2)
        ax.text(limit / GIB, -0.55, limit_label, ha="center", va="bottom", fontsize=9.5)
    ax.legend(loc="lower center", bbox_to_anchor=(0.5, 1.08), ncol=2, frameon=False)


def memory_anatomy(model_name: str = "gpt2-1.5b", micro_batch_size: int = 8, gpu: str = "A100-80GB"):
    """One GPU training ``model_name`` alone (no parallelism), Megatron's mixed precision
    (2 + 4 + 12 bytes per parameter): three rows that differ only in how activations are kept."""
    import labkit.calc as calc
    model = calc.model(model_name)
    par = calc.ParallelConfig(world_size=1, micro_batch_size=micro_batch_size)
    cases = [("flash attention", par, "flash"), ("materialized\nscores", par, "math"),
             ("flash + full\nrecompute", par.with_(recompute_granularity="full"), "flash")]
    rows = [calc.memory_per_stage(model, p, calc.MIXED_18, attention=att)[0] for _, p, att in cases]
    fig, ax = new(4.7, 2.9)
    capacity = calc.GPUS[gpu].memory_bytes
    _stacked(ax, rows, [c[0] for c in cases], capacity, f"{gpu} memory")
    ax.set_xlim(0, max(capacity, *(r["total"] for r in rows)) / GIB * 1.18)
    return fig


def activations_by_layout(seq_length=2048, micro_batch_size=1, hidden_size=12288, heads=96, tp=8):
    """Bytes one layer keeps for the backward, per layout, split into the part linear in s and the
    attention scores (5as/h per token; the part selective recompute and flash attention drop)."""
    import labkit.calc as calc
    s, b, h, a = seq_length, micro_batch_size, hidden_size, heads
    layouts = [("no parallelism", {}), (f"TP {tp}", {"tp": tp}),
               (f"TP {tp} + SP", {"tp": tp, "sequence_parallel": True}),
               (f"TP {tp} + SP +\nselective recompute", {"tp": tp, "sequence_parallel": True, "recompute": "selective"}),
               (f"TP {tp} + SP +\nfull recompute", {"tp": tp, "sequence_parallel": True, "recompute": "full"})]
    fig, ax = new(3.9, 3.2)
    for i, (_, kw) in enumerate(layouts):
        total = calc.activation_bytes_per_layer(s, b, h, a, **kw) / GIB
        if kw.get("recompute"):
            linear, scores = total, 0.0
        else:
            linear = calc.activation_bytes_per_layer(s, b, h, a, **{**kw, "recompute": "selective"}) / GIB
            scores = total - linear
        ax.barh(i, linear, color="#c44e52", height=0.6, label="grows with s" if i == 0 else None)
        ax.barh(i, scores, left=linear, color="#f0a3a6", height=0.6, hatch="//", edgecolor="white",
                label="attention scores, with s²" if i == 0 else None)
        ax.text(total, i, f" {total:.2f}", va="center", fontsize=9.5)
    ax.set_yticks(range(len(layouts)), [name for name, _ in layouts])
    ax.invert_yaxis()
    ax.set_xlabel("GiB per layer and GPU (16-bit)")
    ax.set_xlim(0, ax.get_xlim()[1] * 1.12)
    ax.legend(loc="lower center", bbox_to_anchor=(0.5, 1.02), ncol=2, frameon=False)
    return fig


def zero_stages(num_params: int, dp: int = 8, bytes_param=2, bytes_grad=2, bytes_optim=12):
    """Model states on one of ``dp`` data-parallel GPUs under ZeRO stages 0-3 (Rajbhandari et al.
    2020, Fig. 1): stage 1 shards the optimizer states, 2 also the gradients, 3 also the weights."""
    import labkit.calc as calc
    rows = [calc.zero_memory_per_rank(num_params, dp, stage, bytes_param, bytes_grad, bytes_optim)
            for stage in range(4)]
    fig, ax = new(4.9, 2.7)
    _stacked(ax, rows, ["no ZeRO", "ZeRO-1", "ZeRO-2", "ZeRO-3"])
    ax.set_xlim(0, max(sum(r.values()) for r in rows) / GIB * 1.15)
    return fig


def measured_mfu(run: dict, paper_range: tuple[float, float]):
    """MFU of one GPU per model and attention kernel, from a stored ``gpu-check`` run (``run``:
    data/gpu/h100_gpu_check.json), beside ``paper_range`` (fractions: Narayanan et al. 2021)."""
    import labkit.calc as calc
    from labkit.gpu_check.step import calc_model
    from labkit.model import preset
    peak = run["system"]["gpus"][0]["peak_flops"]
    rows = []
    for r in run["step"]:
        flops = calc.model_flops_per_iteration(calc_model(preset(r["model"])),
                                               calc.ParallelConfig(micro_batch_size=r["micro_batch_size"]))
        rows.append((r["model"], r["attention"], calc.utilization(flops, r["step_seconds"], 1, peak)))
    models = list(dict.fromkeys(m for m, _, _ in rows))
    kernels = list(dict.fromkeys(k for _, k, _ in rows))
    fig, ax = new(5.0, 2.8)
    lo, hi = paper_range
    ax.axhspan(100 * lo, 100 * hi, color="#cccccc", alpha=0.6, lw=0)
    ax.text(len(models) - 0.5, 100 * hi, "Megatron-LM on A100s\n(Narayanan et al. 2021)", ha="right",
            va="bottom", fontsize=9.5)
    width = 0.8 / len(kernels)
    colours = {"math": "#c44e52", "sdpa": "#4c72b0"}
    names = {"math": "labkit attention (math)", "sdpa": "fused attention (sdpa)"}
    for j, k in enumerate(kernels):
        xs = [i + (j - (len(kernels) - 1) / 2) * width for i in range(len(models))]
        ys = [100 * next(u for m2, k2, u in rows if m2 == m and k2 == k) for m in models]
        ax.bar(xs, ys, width=width * 0.95, color=colours.get(k, "#888888"), label=names.get(k, k))
        for x, y in zip(xs, ys):
            ax.text(x, y, f"{y:.0f}", ha="center", va="bottom", fontsize=9.5)
    ax.set_xticks(range(len(models)), models)
    ax.set_ylabel("MFU, % of peak")
    ax.set_ylim(0, 100 * hi * 1.35)
    ax.legend(loc="upper left", frameon=False)
    return fig



# What cuts what: each knob is turned on a probe layout and labkit.calc says which part of pipeline
# stage 0's memory falls. (label, model or None for the figure's, base layout, layout with the knob)
KNOBS = (("TP", None, {"world_size": 1}, {"world_size": 2, "tensor_model_parallel_size": 2}),
         ("SP", None, {"world_size": 2, "tensor_model_parallel_size": 2},
          {"world_size": 2, "tensor_model_parallel_size": 2, "sequence_parallel": True}),
         ("PP", None, {"world_size": 1}, {"world_size": 2, "pipeline_model_parallel_size": 2}),
         ("CP", None, {"world_size": 1}, {"world_size": 2, "context_parallel_size": 2}),
         ("EP (MoE)", "mixtral-8x7b", {"world_size": 2}, {"world_size": 2, "expert_model_parallel_size": 2}),
         ("DP", None, {"world_size": 1}, {"world_size": 2}),
         ("ZeRO-1", None, {"world_size": 2}, {"world_size": 2, "zero_stage": 1}),
         ("ZeRO-2", None, {"world_size": 2}, {"world_size": 2, "zero_stage": 2}),
         ("ZeRO-3", None, {"world_size": 2}, {"world_size": 2, "zero_stage": 3}),
         ("full recompute", None, {"world_size": 1}, {"world_size": 1, "recompute_granularity": "full"}))
AXIS_CHIPS = ("TP", "SP", "PP", "CP", "EP (MoE)", "DP")     # dark chips; knobs (ZeRO, recompute) light
# A cut is a fall of at least 15%: SP's is 20% here (it halves the 10h of a layer's 36h per token
# that TP leaves whole: norm inputs, dropout masks);
# PP's 11% on stage 0 is the logits moving to the last stage, not a cut of the layers' activations.
CUT = 0.15


def memory_cuts(model_name: str = "gpt2-774m", micro_batch_size: int = 8) -> dict:
    """{part: [knob labels]}: the knobs of :data:`KNOBS` under which labkit.calc's bytes of that part
    on the GPU that holds the most of it (the peak over pipeline stages) fall by at least
    ``CUT`` (the same micro batch, 8 microbatches per step, flash attention). Of the ZeRO stages
    only the lowest that cuts a part is kept; "none" lists the knobs that cut no part. PP is not
    listed for activations: under 1F1B the first stage keeps p microbatches of L/p layers."""
    import labkit.calc as calc
    out = {key: [] for key, _, _ in PARTS} | {"none": []}
    for label, other, base, knob in KNOBS:
        model = calc.model(other or model_name)
        rows = []
        for kw in (base, knob):
            par = calc.ParallelConfig(micro_batch_size=micro_batch_size, **kw)
            par = par.with_(global_batch_size=8 * micro_batch_size * par.dp)
            stages = calc.memory_per_stage(model, par, attention="flash")
            rows.append({key: max(r[key] for r in stages) for key, _, _ in PARTS})
        cut = [key for key, _, _ in PARTS if rows[1][key] <= (1 - CUT) * rows[0][key]]
        for key in cut:
            if not (label.startswith("ZeRO") and any(k.startswith("ZeRO") for k in out[key])):
                out[key].append(label)
        out["none"] += [] if cut else [label]
    return out


def fig_memory_cuts(model_name: str = "gpt2-774m", micro_batch_size: int = 8):
    """One GPU's memory as a box (labkit.calc's bytes for ``model_name`` trained alone, flash
    attention), its four parts with Megatron's bytes per parameter, and beside each part the axes
    (dark) and knobs (light) that shrink it, as :func:`memory_cuts` finds them in labkit.calc."""
    from matplotlib.patches import Rectangle

    import labkit.calc as calc
    p = calc.MIXED_18
    row = calc.memory_per_stage(calc.model(model_name), calc.ParallelConfig(micro_batch_size=micro_batch_size),
                                p, attention="flash")[0]
    cuts = memory_cuts(model_name, micro_batch_size)
    what = {"params": f"weights: {p.bytes_param} B/param (bf16)",
            "grads": f"gradients: {p.bytes_grad} B/param (fp32 main_grad)",
            "optimizer": f"optimizer: {p.sharded_bytes} B/param (fp32 copy, Adam m, v)",
            "activations": "activations: per layer, per microbatch held"}
    W, H, top, bottom = 5.0, 3.5, 0.45, 3.05           # data units are inches (subplots_adjust below)
    fig, ax = new(W, H)
    scale, y, mids = (bottom - top) / row["total"], bottom, {}
    for key, _, colour in PARTS:                       # stacked bottom-up: weights first
        hgt = row[key] * scale
        ax.add_patch(Rectangle((0.1, y - hgt), 0.75, hgt, fc=colour, ec="white", lw=1))
        mids[key], y = y - hgt / 2, y - hgt
    ax.text(0.475, top - 0.06, f"{row['total'] / GIB:.0f} GiB", ha="center", va="bottom")
    ax.text(0.475, bottom + 0.06, "one GPU", ha="center", va="top")
    step = (bottom - top) / len(PARTS)
    for i, (key, _, colour) in enumerate(reversed(PARTS)):   # listed top-down, as stacked
        ty = top + (i + 0.25) * step
        ax.plot([0.87, 1.0, 1.12], [mids[key], mids[key], ty], color=colour, lw=1.2)
        ax.text(1.17, ty, what[key], va="center", color=colour)
        x = 1.22
        for label in cuts[key]:
            dark = label in AXIS_CHIPS
            ax.text(x, ty + 0.3, label, va="center", color="white" if dark else "black",
                    bbox=dict(boxstyle="round,pad=0.25", fc="#333333" if dark else "#dddddd", ec="none"))
            x += 0.075 * len(label) + 0.25               # about one 10 pt character each, and a gap
    none = cuts["none"]
    note = ("DP alone shrinks none of them: it splits the batch" if none == ["DP"]
            else f"shrink none of them: {', '.join(none)}" if none else "")
    ax.text(1.17, bottom + 0.06, note, va="top")
    ax.set_xlim(0, W)
    ax.set_ylim(H, 0)
    ax.axis("off")
    fig.subplots_adjust(0, 0, 1, 1)
    return fig

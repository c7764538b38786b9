"""Figures of the chapter "Where the time goes", drawn from ``labkit.calc.roofline``.

* :func:`fig_rooflines`   the roofline of four GPUs (A100, H100, H200, B200) with their ridges
* :func:`fig_layer_ops`   one layer's ops and a layout's collectives placed on one GPU's rooflines
* :func:`fig_crossovers`  where each axis turns communication-bound, against the group size
"""
from __future__ import annotations

from ..calc import CLUSTERS, roofline as rl
from .style import new

GPU_CLUSTERS = ("dgx-a100", "dgx-h100", "dgx-h200", "dgx-b200")
LINK_COLORS = {"HBM": "#1f77b4", "NVLink": "#2ca02c", "network": "#d62728"}
INTENSITIES = [10 ** (k / 20) for k in range(0, 101)]     # 1 ... 1e5 FLOPs per byte


def _ticks(ax, axis, lo, hi):
    """Plain decade labels (mathtext's superscripts would be under 9 px on a phone)."""
    names = {0: "1", 1: "10", 2: "100", 3: "1k", 4: "10k", 5: "100k", 6: "1M"}
    values = [10 ** k for k in range(lo, hi + 1)]
    getattr(ax, f"set_{axis}ticks")(values, [names[k] for k in range(lo, hi + 1)])


def fig_rooflines(clusters=GPU_CLUSTERS):
    """Attainable TFLOP/s against FLOPs per HBM byte, one roofline per GPU, a dot at each ridge (its
    value in the legend: beside the dots, H200's 206 and H100's 295 printed over each other)."""
    fig, ax = new(5.0, 3.0)
    for key in clusters:
        gpu = CLUSTERS[key].gpu
        r = rl.ridge(gpu.peak_flops, gpu.hbm_bandwidth)
        y = [rl.attainable_flops(i, gpu.peak_flops, gpu.hbm_bandwidth) / 1e12 for i in INTENSITIES]
        line, = ax.loglog(INTENSITIES, y, label=f"{gpu.name.split('-')[0]}, ridge {r:.0f}")
        ax.plot([r], [gpu.peak_flops / 1e12], "o", color=line.get_color())
    ax.minorticks_off()
    ax.set_xlabel("arithmetic intensity (FLOPs per byte of HBM)")
    ax.set_ylabel("attainable TFLOP/s (16-bit)")
    ax.set_xlim(1, 1e4)
    ax.set_ylim(1, 4000)
    _ticks(ax, "x", 0, 4)
    _ticks(ax, "y", 0, 3)
    ax.legend(frameon=False, loc="lower right", ncol=2)   # upper left, it covered B200's slope
    fig.tight_layout()
    return fig


def _link_bandwidths(cluster):
    return {"HBM": cluster.gpu.hbm_bandwidth, "NVLink": cluster.intra_node_bandwidth,
            "network": cluster.inter_node_bandwidth / cluster.gpus_per_node}


def fig_layer_ops(model=None, cluster=None, layout=None, micro_batch_size=1, num_microbatches=8):
    """(Defaults: Llama 3 70B on DGX H100 nodes, TP 8, CP 2, DP 8.) The forward ops of one layer (circles, on the HBM roof) and the layout's collectives
    (diamonds, each on the roof of the bandwidth its group gets: ``rl.layout_links``)."""
    from ..calc import model as preset
    model, cluster = model or preset("llama3-70b"), cluster or CLUSTERS["dgx-h100"]
    layout = layout or {"tp": 8, "cp": 2, "dp": 8}
    gpu, links = cluster.gpu, rl.layout_links(cluster, layout)
    roofs = {"HBM": gpu.hbm_bandwidth, **{f"{name} {bw / 1e9:.0f} GB/s": bw for bw, name in links.values()}}
    fig, ax = new(5.0, 3.4)
    for name, bw in roofs.items():
        ax.loglog(INTENSITIES, [rl.attainable_flops(i, gpu.peak_flops, bw) / 1e12 for i in INTENSITIES],
                  color=LINK_COLORS[name.split()[0]],
                  label=f"{name}, ridge {gpu.peak_flops / bw:,.0f}")
    ops = rl.layer_ops(model, layout.get("tp", 1), layout.get("cp", 1), micro_batch_size, ep=layout.get("ep", 1))
    comms = rl.comm_ops(model, layout, micro_batch_size, num_microbatches=num_microbatches)
    top = 0
    for op in sorted(ops + comms, key=lambda o: o.intensity):
        bw, where = (gpu.hbm_bandwidth, "HBM") if op.kind != "collective" else links[op.memory]
        y = rl.attainable_flops(op.intensity, gpu.peak_flops, bw) / 1e12
        ax.plot([op.intensity], [y], "D" if op.kind == "collective" else "o", color=LINK_COLORS[where],
                markeredgecolor="black", markersize=7, zorder=3)
        if y < gpu.peak_flops / 1e12 * 0.99:        # below its roof: the label beside the point
            ax.annotate(op.name, (op.intensity, y), textcoords="offset points", xytext=(6, -4))
        else:                                       # on the flat roof: labels stacked underneath
            ax.annotate(op.name, (op.intensity, y), xytext=(op.intensity, y / 2.0 ** (1 + top % 6)),
                        ha="center", arrowprops={"arrowstyle": "-", "color": "#888", "lw": 0.6})
            top += 1
    ax.minorticks_off()
    ax.set_xlabel("FLOPs per byte (HBM; for a diamond, its link)")
    ax.set_ylabel("attainable TFLOP/s")
    ax.set_xlim(0.5, 2e5)
    ax.set_ylim(0.5, gpu.peak_flops / 1e12 * 3)
    _ticks(ax, "x", 0, 5)
    _ticks(ax, "y", 0, 3)
    # short handles, flush with the corner: a wider legend covered the network roof's slope
    ax.legend(frameon=False, loc="lower right", handlelength=1.0, handletextpad=0.4, borderaxespad=0.1)
    fig.tight_layout()
    return fig


AXIS_STYLE = (("tp", "TP: hidden size h", "NVLink"), ("cp", "CP: sequence s (GQA 1/8)", "network"),
              ("ep", "EP: expert FFN (SwiGLU)", "network"), ("dp", "DP: tokens/GPU/step", "network"),
              ("fsdp", "FSDP: tokens/GPU/step", "network"))


def fig_crossovers(cluster=None, sizes=range(2, 17)):
    """The crossover of each axis against its group size n on ``cluster``: TP over NVLink, the
    others over the network. Above its line an axis hides its traffic behind its compute."""
    cluster = cluster or CLUSTERS["dgx-h100"]
    gpu, bws = cluster.gpu, _link_bandwidths(cluster)
    fig, ax = new(5.0, 3.6)
    ns = list(sizes)
    for axis, label, link in AXIS_STYLE:
        y = [rl.crossover(axis, n, gpu.peak_flops, bws[link], swiglu=axis == "ep",
                          kv_ratio=0.125 if axis == "cp" else 1.0) for n in ns]
        ax.semilogy(ns, y, marker="o", markersize=3, label=f"{label} ({link})")
    ax.minorticks_off()
    ax.set_xlabel("group size n")
    ax.set_ylabel("crossover (comm = compute)")
    ax.legend(frameon=False, loc="upper left", ncol=1, handlelength=1.2, labelspacing=0.25)
    ax.set_ylim(300, 2e6)
    _ticks(ax, "y", 3, 6)
    ax.grid(True, which="major", alpha=0.3)
    fig.tight_layout()
    return fig

"""Figures of the chapter "Data parallelism and ZeRO", drawn from labkit's own objects
(``data_parallel.ddp.make_buckets``, ``data_parallel.shard_layout.ShardLayout``,
``calc.memory.zero_memory_per_rank``) and from measured runs (``measure.dp``).

    fig_buckets(bucket_size)   the buckets of a small GPT, filled in reverse forward order
    fig_overlap(out)           one iteration, naive vs bucketed DDP (measured on gloo)
    fig_zero_shards(dp)        what each rank holds under DP and ZeRO-1/2/3
    fig_zero_memory(held)      bytes per parameter each rank holds, measured, ZeRO 0-3 x dp
"""
from __future__ import annotations

from ..measure.dp_plot import PARTS, plot_memory, plot_overlap
from .style import new

BUCKET_COLORS = ["#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860"]
SHORT = {"final_layernorm": "final norm", "linear_fc2": "fc2", "linear_fc1": "fc1",
         "pre_mlp_layernorm": "norm", "linear_proj": "proj", "linear_qkv": "qkv",
         "input_layernorm": "norm", "position_embeddings": "pos emb", "word_embeddings": "word emb"}


def _short(name: str) -> str:
    part = name.split(".")[-2]
    return SHORT.get(part, part)


def fig_buckets(bucket_size: int = 3000, **model):
    """One row per bucket of ``make_buckets`` on a GPT (default: the chapter's 1-layer, h = 32):
    its parameters as segments as wide as their element counts, in the order they join."""
    from ..config import TrainConfig
    from ..data_parallel.ddp import make_buckets
    from ..model import GPT
    model = model or dict(num_layers=1, hidden_size=32, num_attention_heads=4, seq_length=16)
    gpt = GPT(TrainConfig(**model).model_config())
    names = {id(p): n for n, p in gpt.named_parameters()}
    buckets = make_buckets(list(gpt.parameters()), bucket_size, group=None)
    fig, ax = new(5.0, 0.5 * len(buckets) + 1.0)
    for b in buckets:
        x = 0
        for p in b.params:
            ax.barh(b.index, p.numel(), left=x, color=BUCKET_COLORS[b.index % len(BUCKET_COLORS)],
                    edgecolor="white", linewidth=0.8, height=0.7)
            x += p.numel()
        mods = list(dict.fromkeys(_short(names[id(p)]) for p in b.params))
        ax.text(x + 150, b.index, ", ".join(mods), va="center")
    ax.axvline(bucket_size, color="black", ls=":", lw=1)
    ax.text(bucket_size, -0.6, f"bucket size {bucket_size}", ha="center", va="bottom")
    ax.set_yticks(range(len(buckets)), [f"bucket {b.index}" for b in buckets])
    ax.set_ylim(len(buckets) - 0.5, -0.9)
    ax.set_xlim(0, max(b.numel for b in buckets) * 1.9)
    ax.set_xlabel("elements (gradients ready first at the top)")
    fig.tight_layout()
    return fig


def fig_overlap(out: dict):
    """Naive vs bucketed DDP, one iteration of rank 0 (``measure.dp.overlap_worker``)."""
    fig, axes = new(5.0, 3.6, nrows=2)
    plot_overlap(out, axes)
    fig.tight_layout()
    return fig


def fig_zero_shards(dp: int = 4, num_params: int = 1000):
    """Rows: plain DP and ZeRO-1/2/3; columns: dp ranks. In each cell the parameters, gradients
    and optimizer states (heights 4, 4 and 8 bytes per parameter) as the bar of the whole flat
    buffer, filled where the rank holds it: all of it, or only its shard (``ShardLayout``)."""
    from matplotlib.patches import Rectangle

    from ..calc.memory import zero_memory_per_rank
    from ..data_parallel.shard_layout import ShardLayout
    layout = ShardLayout([num_params], dp)
    stages = ["DP", "ZeRO-1", "ZeRO-2", "ZeRO-3"]
    heights = {"params": 4, "grads": 4, "optimizer": 8}
    fig, ax = new(5.0, 3.3)
    row_h, col_w = 20, 1.0
    for s, stage in enumerate(stages):
        held = zero_memory_per_rank(num_params, dp, s)
        y = s * row_h
        for r in range(dp):
            lo, hi = layout.shard_range(r)
            x0 = r * (col_w + 0.15)
            yy = y
            for part, color in PARTS:
                h = heights[part]
                ax.add_patch(Rectangle((x0, yy), col_w, h, fc="white", ec=color, lw=0.8))
                full = held[part] == num_params * {"params": 4, "grads": 4, "optimizer": 8}[part]
                a, b = (0, 1) if full else (lo / layout.padded_numel, hi / layout.padded_numel)
                ax.add_patch(Rectangle((x0 + a * col_w, yy), (b - a) * col_w, h, fc=color, ec=color))
                yy += h + 0.6
        per_param = sum(held.values()) / num_params
        ax.text(dp * (col_w + 0.15), y + 8.5, f"{per_param:g} B", va="center")
    ax.set_yticks([s * row_h + 8.5 for s in range(4)], stages)
    ax.set_xticks([r * (col_w + 0.15) + col_w / 2 for r in range(dp)], [f"rank {r}" for r in range(dp)])
    ax.xaxis.tick_top()
    ax.tick_params(length=0)
    for side in ("left", "bottom", "top", "right"):
        ax.spines[side].set_visible(False)
    ax.set_xlim(-0.05, dp * (col_w + 0.15) + 0.75)
    ax.set_ylim(3 * row_h + 18, -1)
    handles = [Rectangle((0, 0), 1, 1, color=c) for _, c in PARTS]
    ax.legend(handles, ["params (4 B)", "grads (4 B)", "Adam m, v (8 B)"], ncol=3, frameon=False,
              loc="upper center", bbox_to_anchor=(0.45, 0.0))
    fig.tight_layout()
    return fig


def fig_zero_memory(held: dict):
    """``held[(stage, dp)]``: measured bytes one rank holds (``measure.dp.memory_worker``)."""
    fig, ax = new(5.0, 3.0)
    plot_memory(held, ax)
    fig.tight_layout()
    return fig

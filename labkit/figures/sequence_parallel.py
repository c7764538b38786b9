"""Figures of the chapter "Sequence parallelism", drawn from the TP + SP plan, labkit's itemized
activation count (``measure.activations``, equal to what autograd saves, measured in the
chapter) and the bytes the chapter's runs counted.

    fig_sp_layer(t)              one layer on t ranks: sequence-sharded regions, g and g-bar
    fig_sp_activations(...)      bytes a layer keeps for its backward, per layout, itemized
    fig_sp_bytes(comm)           bytes a rank sends per layer: TP, TP + SP, SP with re-gather
"""
from __future__ import annotations

from .style import new
from .tensor_parallel import fig_tp_layer

GROUPS = {   # labkit's itemized entries, grouped for the figure
    "norms": ("layer norm inputs (2)", "layer norm mean and rstd (2 x 2)"),
    "GEMM inputs": ("linear_qkv and linear_fc1 inputs", "linear_proj input", "linear_fc2 input"),
    "attention": ("Q, K, V", "softmax output", "causal mask (bool)"),
    "GeLU input": ("GeLU input",),
}
GROUP_COLORS = ("#8172b3", "#4c72b0", "#dd8452", "#55a868")
LAYOUTS = [(1, False, False), (2, False, False), (2, True, False), (2, True, True),
           (4, False, False), (4, True, False), (4, True, True)]


def fig_sp_layer(t: int = 2):
    """``tensor_parallel.fig_tp_layer`` under sequence parallelism."""
    return fig_tp_layer(sequence_parallel=True, t=t)


def _layout_name(tp, sp, rg):
    return f"TP {tp}" + (" + SP" if sp else "") + (" re-gather" if rg else "")


def fig_sp_activations(seq_length: int = 16, micro_batch_size: int = 2, hidden_size: int = 32,
                       num_attention_heads: int = 4, bytes_per_element: int = 2, layouts=None):
    """Stacked bars: what one layer keeps on one rank (labkit's itemized count, 16-bit), per
    layout; the black tick is Korthikanti et al.'s formula (labkit.calc), which also counts the
    dropout masks labkit's dropout-free layer does not keep."""
    from ..calc.memory import activation_bytes_per_layer
    from ..measure.activations import labkit_layer_activation_bytes
    s, b, h, a = seq_length, micro_batch_size, hidden_size, num_attention_heads
    layouts = layouts or LAYOUTS
    fig, ax = new(4.7, 0.36 * len(layouts) + 1.3)
    kib = 1024
    for i, (tp, sp, rg) in enumerate(layouts):
        items = labkit_layer_activation_bytes(s, b, h, a, tp, sp, bytes_per_element, regather=rg)
        left = 0.0
        for (group, keys), color in zip(GROUPS.items(), GROUP_COLORS):
            v = sum(items[k] for k in keys) / kib
            ax.barh(i, v, left=left, color=color, height=0.65, label=group if i == 0 else None)
            left += v
        formula = activation_bytes_per_layer(s, b, h, a, tp, sp) / kib
        ax.plot([formula, formula], [i - 0.4, i + 0.4], color="black", lw=2,
                label="paper's formula" if i == 0 else None)
    ax.set_yticks(range(len(layouts)), [_layout_name(*x) for x in layouts])
    ax.set_ylim(len(layouts) - 0.5, -0.5)
    ax.set_xlabel(f"KiB one layer keeps (s={s}, b={b}, h={h}, 16-bit)")
    ax.legend(frameon=False, ncol=3, loc="lower center", bbox_to_anchor=(0.3, 1.0),
              columnspacing=1.0, handlelength=1.5)
    fig.tight_layout()
    return fig


OP_COLORS = {"all_reduce": "#c44e52", "all_gather": "#4c72b0", "reduce_scatter": "#55a868"}


def fig_sp_bytes(comm: dict):
    """``comm[layout name] = {op: {"bytes", "calls"}}``: what rank 0 sent in one layer's forward
    and backward (the chapter's ``block_parity`` runs), stacked by collective."""
    names = list(comm)
    fig, ax = new(4.7, 0.42 * len(names) + 1.2)
    for i, name in enumerate(names):
        left = 0.0
        for op, color in OP_COLORS.items():
            got = comm[name].get(op)
            if not got:
                continue
            v = got["bytes"] / 1024
            ax.barh(i, v, left=left, color=color, height=0.6, label=op.replace("_", "-"))
            ax.text(left + v / 2, i, f"{got['calls']}x", ha="center", va="center", color="white")
            left += v
        ax.text(left + 0.5, i, f"{left:g} KiB", va="center")
    handles, labels = ax.get_legend_handles_labels()
    seen = dict(zip(labels, handles))
    ax.legend(seen.values(), seen.keys(), frameon=False, ncol=3, loc="lower center",
              bbox_to_anchor=(0.3, 1.0), columnspacing=1.0, handlelength=1.5)
    ax.set_yticks(range(len(names)), names)
    ax.set_ylim(len(names) - 0.5, -0.5)
    ax.set_xlim(0, max(sum(v["bytes"] for v in c.values()) for c in comm.values()) / 1024 * 1.3)
    ax.set_xlabel("KiB rank 0 sends, one layer, forward + backward")
    fig.tight_layout()
    return fig

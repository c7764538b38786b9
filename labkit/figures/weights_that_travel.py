"""Figures of the chapter "Weights that travel" (book/weights-that-travel.ipynb), in the house style.

    fig_three_layouts(...)   one layer's fused QKV and SwiGLU fc1, row block by row block, as labkit
                             and Megatron-Core hold them, as Megatron's torch_dist stores them under
                             TP2, and as Hugging Face's Llama files name them

Drawn by running the converters (``labkit.interop``) on tensors whose rows carry their own labels:
the figure is what the code does, not a picture of it.
"""
from __future__ import annotations

import re

from .style import FONT_PT, new

COLORS = {"q": "#3b6ea8", "k": "#d9822b", "v": "#3a8a4f", "gate": "#7b4ea8", "up": "#b03a2e"}


def _rows(heads: int, groups: int, ffn_blocks: int):
    """Row labels of labkit's linear_qkv (one row per head, head_dim 1) and linear_fc1 (one row per
    block of the ffn), and the dense state dict whose rows are their indices."""
    import torch
    per = heads // groups
    qkv = []
    for j in range(groups):        # labkit.modules.SelfAttention: per group [q heads | k | v]
        qkv += [f"q{j * per + i}" for i in range(per)] + [f"k{j}", f"v{j}"]
    fc1 = [f"gate{i}" for i in range(ffn_blocks)] + [f"up{i}" for i in range(ffn_blocks)]
    state = {"decoder.layers.0.self_attention.linear_qkv.weight": torch.arange(len(qkv)).view(-1, 1),
             "decoder.layers.0.mlp.linear_fc1.weight": torch.arange(len(fc1)).view(-1, 1)}
    return qkv, fc1, state


def layouts(heads: int = 4, groups: int = 2, ffn_blocks: int = 4, tp: int = 2) -> dict:
    """{panel: [(tensor name, [row labels])]} for labkit, Megatron torch_dist under ``tp``, Hugging
    Face (Llama), computed by ``labkit.interop``'s own functions."""
    from ..interop.hf_names import split_qkv
    from ..interop.megatron_format import key_of
    qkv, fc1, state = _rows(heads, groups, ffn_blocks)
    w_qkv = state["decoder.layers.0.self_attention.linear_qkv.weight"]
    w_fc1 = state["decoder.layers.0.mlp.linear_fc1.weight"]
    lab = lambda labels, t: [labels[int(i)] for i in t.view(-1)]            # noqa: E731
    q, k, v = split_qkv(w_qkv, heads, groups, 1)
    gate, up = w_fc1.chunk(2)
    out = {"labkit and\nMegatron-Core": [("linear_qkv", lab(qkv, w_qkv)), ("linear_fc1", lab(fc1, w_fc1))]}

    class _Cfg:     # the fields key_of reads: a dense model (no experts)
        num_experts = None
    meg = []
    for name, w, labels in (("decoder.layers.0.self_attention.linear_qkv.weight", w_qkv, qkv),
                            ("decoder.layers.0.mlp.linear_fc1.weight", w_fc1, fc1)):
        key, index = key_of(name, _Cfg)          # decoder.layers.<...>, layer 0 of a stacked [L, ...]
        short = f"{key.split('.')[-2]}[{index[0]}]"
        if "fc1" in name:   # TP rank r computes [gate_r; up_r]; it stores them at r and tp + r of 2tp
            rows = [f"{x}: r{r}" for part in w.chunk(2) for r, t in enumerate(part.chunk(tp)) for x in lab(labels, t)]
        else:               # column-parallel: rank r holds whole query groups, contiguous
            rows = [f"{x}: r{r}" for r, t in enumerate(w.chunk(tp)) for x in lab(labels, t)]
        meg.append((short, rows))
    out[f"torch_dist,\nTP{tp} pieces"] = meg
    out["Hugging Face\n(Llama)"] = [("q_proj", lab(qkv, q)), ("k_proj", lab(qkv, k)), ("v_proj", lab(qkv, v)),
                                          ("gate_proj", lab(fc1, gate)), ("up_proj", lab(fc1, up))]
    return out


def fig_three_layouts(heads: int = 4, groups: int = 2, ffn_blocks: int = 4, tp: int = 2):
    """Three columns (labkit, Megatron torch_dist under TP, Hugging Face), each a stack of tensors
    whose row blocks are coloured by what they hold (q/k/v of a head or group, gate/up)."""
    from matplotlib.patches import Rectangle
    panels = layouts(heads, groups, ffn_blocks, tp)
    n_rows = max(sum(len(r) for _, r in tensors) + len(tensors) for tensors in panels.values())
    fig, ax = new(4.8, 0.19 * n_rows + 0.9)
    ax.set_position([0, 0, 1, 1])
    ax.set_axis_off()
    ax.set_xlim(0, 3)
    ax.set_ylim(n_rows + 1.6, -0.2)
    for c, (title, tensors) in enumerate(panels.items()):
        ax.text(c + 0.5, 0.3, title, ha="center", va="center", fontsize=FONT_PT, fontweight="bold")
        y = 1.4
        for name, labels in tensors:
            ax.text(c + 0.06, y + 0.45, name, ha="left", va="center", fontsize=FONT_PT, family="DejaVu Sans Mono")
            y += 0.9
            for label in labels:
                color = COLORS[re.match("[a-z]+", label).group()]
                ax.add_patch(Rectangle((c + 0.1, y), 0.8, 0.9, fc=color + "40", ec=color, lw=0.8))
                ax.text(c + 0.5, y + 0.47, label, ha="center", va="center", fontsize=FONT_PT)
                y += 0.9
            y += 0.35
    return fig

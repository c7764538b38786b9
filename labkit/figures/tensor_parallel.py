"""Figures of the chapters "Tensor parallelism" and "Sequence parallelism", drawn from labkit's
own objects: the weights ``ColumnParallelLinear.from_dense`` / ``RowParallelLinear.from_dense``
really keep (read from a dense weight whose entries are their own indices), the plan
``tensor_parallel.plan.tp_plan`` (which operator sits where), the operators' table in
``tensor_parallel.tp_comm`` (what each does forward and backward) and ``config.padded_vocab_size``.

    fig_tp_weights(h, heads, t)   which slice of linear_qkv, linear_proj, fc1, fc2 each rank keeps
    fig_tp_layer(sp, t)           one layer on t ranks: regions, f / f-bar (or g / g-bar)
    fig_vocab(vocab, ts)          the vocabulary padded and cut into t ranges
"""
from __future__ import annotations

import re

from .style import new

RANK_COLORS = ["#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860", "#da8bc3", "#8c8c8c"]
SYMBOL = {"f": "$f$", "f-bar": r"$\bar{f}$", "g": "$g$", "g-bar": r"$\bar{g}$"}


class _OneRank:
    """A stand-in tp group seen from rank ``rank`` of ``size``: what ``from_dense`` reads."""

    def __init__(self, size: int, rank: int):
        self.size, self.rank = size, rank


def owners(cls, linear, t: int):
    """[out, in] tensor: which tp rank's ``cls.from_dense(linear, group)`` keeps each weight entry."""
    import torch
    dense = torch.nn.Linear(linear.in_features, linear.out_features)
    with torch.no_grad():
        dense.weight.copy_(torch.arange(dense.weight.numel(), dtype=torch.float64).view_as(dense.weight))
    owner = torch.full(dense.weight.shape, -1, dtype=torch.long)
    for r in range(t):
        kept = cls.from_dense(dense, _OneRank(t, r)).weight.detach().long().reshape(-1)
        owner.view(-1)[kept] = r
    return owner


def operators() -> dict:
    """{symbol: (forward, backward)} parsed from the table at the top of ``tp_comm``."""
    from ..tensor_parallel import tp_comm
    ops = {}
    for line in tp_comm.__doc__.splitlines():
        m = re.match(r"\|\s*\w+\s+\(([fg](?:-bar)?)\)\s*\|\s*([^|]+?)\s*\|\s*([^|]+?)\s*\|", line)
        if m:
            ops[m.group(1)] = (m.group(2), m.group(3))
    return ops


def _matrix(ax, owner, x0, y0, cell, title, col_labels=None):
    from matplotlib.patches import Rectangle
    rows, cols = owner.shape
    for i in range(rows):
        for j in range(cols):
            ax.add_patch(Rectangle((x0 + j * cell, y0 + i * cell), cell, cell,
                                   fc=RANK_COLORS[int(owner[i, j])], ec="white", lw=0.4))
    ax.text(x0, y0 - 0.12, title, ha="left", va="bottom")
    for j, lab in (col_labels or {}).items():
        ax.text(x0 + (j + 0.5) * cell, y0 + rows * cell + 0.08, lab, ha="center", va="top")


def fig_tp_weights(hidden_size: int = 4, num_attention_heads: int = 2, t: int = 2):
    """The weights as X @ A (A = the stored weight transposed, [in, out]) of one layer's four
    linears, each entry coloured by the rank that keeps it."""
    from torch import nn

    from ..tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear
    h, a = hidden_size, num_attention_heads
    d = h // a
    mats = [("linear_qkv [h, 3h]", ColumnParallelLinear, nn.Linear(h, 3 * h)),
            ("linear_proj [h, h]", RowParallelLinear, nn.Linear(h, h)),
            ("linear_fc1 [h, 4h]", ColumnParallelLinear, nn.Linear(h, 4 * h)),
            ("linear_fc2 [4h, h]", RowParallelLinear, nn.Linear(4 * h, h))]
    own = [owners(cls, lin, t).T for _, cls, lin in mats]            # [in, out], as X @ A
    cell = 0.2
    fig, ax = new(5.0, 3.9)
    heads = {i * 3 * d + k * d + d // 2 - 0.5: f"{'qkv'[k]}{i}" for i in range(a) for k in range(3)}
    _matrix(ax, own[0], 0.0, 0.0, cell, mats[0][0], heads)
    _matrix(ax, own[1], 3 * h * cell + 0.5, 0.0, cell, mats[1][0])
    y2 = h * cell + 0.95
    _matrix(ax, own[2], 0.0, y2, cell, mats[2][0])
    _matrix(ax, own[3], 4 * h * cell + 0.5, y2, cell, mats[3][0])
    ax.text(4 * h * cell + 0.5 + h * cell + 0.15, y2, "by rows:\npartial sums\n-> all-reduce",
            va="top")
    ax.text(0.0, y2 + h * cell + 0.1, "by columns: GeLU\nneeds no exchange", va="top")
    ax.text(3 * h * cell + 0.5 + h * cell + 0.15, 0.0, "by rows:\npartial sums", va="top")
    ax.text(0.0, -0.45, "by columns: whole heads per rank", va="bottom")
    from matplotlib.patches import Rectangle
    ax.legend([Rectangle((0, 0), 1, 1, color=RANK_COLORS[r]) for r in range(t)],
              [f"tp rank {r}" for r in range(t)], ncol=t, frameon=False, loc="upper center",
              bbox_to_anchor=(0.5, 0.02))
    ax.set_xlim(-0.05, 5.0)
    ax.set_ylim(y2 + 4 * h * cell + 0.1, -0.45)
    ax.set_aspect("equal")
    ax.axis("off")
    fig.tight_layout()
    return fig


def layer_rows(sequence_parallel: bool, t: int = 2, heads: int = 4):
    """One transformer layer as rows (name, kind, lane labels, shape per rank, operator) read from
    ``tp_plan`` (keyed by role: qkv, proj, fc1, fc2): kind is act (outside the TP region), col, local, row or op (an operator)."""
    from ..tensor_parallel.plan import tp_plan
    plan = {k: v.what for k, v in tp_plan(sequence_parallel).items()}
    sp = sequence_parallel
    outside = "[b, s/t, h]" if sp else "[b, s, h]"
    act_lane = [f"s part {r}" for r in range(t)] if sp else ["all of s"] * t
    per = heads // t

    def op_in(name):
        return plan[name].split(" -> ")[0].split(" (")[0]

    def op_out(name):
        return plan[name].split(" -> ")[1].split(" (")[0]
    return [
        ("layer input", "act", act_lane, outside, None),
        ("input_layernorm", "act", act_lane, outside, None),
        ("", "op", None, "", op_in("qkv")),
        ("linear_qkv", "col", [f"heads {r * per}-{r * per + per - 1}" for r in range(t)],
         "[b, s, 3h/t]", None),
        ("attention", "local", [f"heads {r * per}-{r * per + per - 1}" for r in range(t)],
         "[b, s, h/t]", None),
        ("linear_proj", "row", ["partial"] * t, "[b, s, h]", None),
        ("", "op", None, "", op_out("proj")),
        ("dropout, + residual", "act", act_lane, outside, None),
        ("pre_mlp_layernorm", "act", act_lane, outside, None),
        ("", "op", None, "", op_in("fc1")),
        ("linear_fc1", "col", ["4h/t"] * t, "[b, s, 4h/t]", None),
        ("GeLU", "local", ["4h/t"] * t, "[b, s, 4h/t]", None),
        ("linear_fc2", "row", ["partial"] * t, "[b, s, h]", None),
        ("", "op", None, "", op_out("fc2")),
        ("dropout, + residual", "act", act_lane, outside, None),
    ]


def fig_tp_layer(sequence_parallel: bool = False, t: int = 2):
    """One layer on ``t`` ranks, top to bottom: what each rank holds at each step (lanes), the
    region each step is in, and the conjugate operators at the borders with their forward and
    backward collectives."""
    from matplotlib.patches import Rectangle
    rows = layer_rows(sequence_parallel, t)
    ops = operators()
    width = 4.8                               # inches, and the x data units (see subplots_adjust)
    fig, ax = new(width, 0.3 * len(rows) + 0.9)
    lane_x, lane_w, gap = 1.45, 2.2 / t, 0.05
    outside_fc = "#fff2cc" if sequence_parallel else "#eeeeee"
    for i, (name, kind, lanes, shape, op) in enumerate(rows):
        y = i
        if kind == "op":
            fwd, bwd = ops[op]
            ax.add_patch(Rectangle((lane_x, y - 0.34), width - lane_x, 0.68, fc="#333333"))
            ax.text(lane_x + 0.1, y, SYMBOL[op], color="white", va="center", fontsize=12)
            ax.text(lane_x + 0.4, y, f"fwd {fwd}, bwd {bwd}", color="white", va="center")
            continue
        ax.text(lane_x - 0.08, y, name, ha="right", va="center")
        for r in range(t):
            x = lane_x + r * lane_w
            if kind == "act":
                fc, ec = (RANK_COLORS[r], "none") if sequence_parallel else (outside_fc, "#999999")
                tc = "white" if sequence_parallel else "black"
            else:
                fc, ec, tc = ("white", RANK_COLORS[r], "black") if kind == "row" else (RANK_COLORS[r], "none", "white")
            ax.add_patch(Rectangle((x + gap / 2, y - 0.38), lane_w - gap, 0.76, fc=fc, ec=ec, lw=1.2))
            ax.text(x + lane_w / 2, y, lanes[r], ha="center", va="center", color=tc)
        ax.text(lane_x + t * lane_w + 0.1, y, shape, va="center")
    for r in range(t):
        ax.text(lane_x + (r + 0.5) * lane_w, -0.75, f"rank {r}", ha="center", va="bottom")
    ax.set_xlim(0, width)
    ax.set_ylim(len(rows) - 0.4, -1.0)
    ax.axis("off")
    fig.subplots_adjust(0, 0, 1, 1)          # data units are inches: the bands end at the edge
    return fig


def fig_vocab(vocab_size: int = 50257, ts=(1, 2, 4, 8), divisible_by: int = 128):
    """The vocabulary padded to a multiple of ``divisible_by * t`` (``padded_vocab_size``) and cut
    into t equal row ranges (``vocab_parallel.vocab_range``); the padding hatched."""
    from ..config import padded_vocab_size
    from ..tensor_parallel.vocab_parallel import vocab_range
    fig, ax = new(5.0, 0.42 * len(ts) + 1.0)
    widest = padded_vocab_size(vocab_size, divisible_by, max(ts))
    for i, t in enumerate(ts):
        padded = padded_vocab_size(vocab_size, divisible_by, t)
        for r in range(t):
            lo, hi = vocab_range(padded, r, t)
            ax.barh(i, hi - lo, left=lo, color=RANK_COLORS[r % len(RANK_COLORS)], height=0.6,
                    edgecolor="white")
        ax.barh(i, padded - vocab_size, left=vocab_size, height=0.6, color="none", hatch="////",
                edgecolor="black", lw=0.6)
        ax.text(widest * 1.01, i, f"{padded:,} (+{padded - vocab_size})", va="center")
    ax.set_yticks(range(len(ts)), [f"TP {t}" for t in ts])
    ax.set_ylim(len(ts) - 0.5, -0.5)
    ax.set_xlim(0, widest * 1.33)
    ax.set_xticks([0, 25000, 50000], ["0", "25k", "50k"])
    ax.set_xlabel("vocabulary rows (hatched: padding)")
    fig.tight_layout()
    return fig

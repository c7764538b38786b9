"""Frames of the book's moving pictures: the ring collectives and the ZeRO stages, step by step.

Pure Python (no torch): the book's player (``book/_static/moving/player.js``, directive
``{labkit-player}``) draws these frames; the build computes them and embeds them as JSON.

* :func:`ring_frames` runs the textbook ring (Patarasuk & Yuan 2009) on n ranks, each holding n
  chunks: at step k rank r sends one chunk to rank r + 1. A cell is the set of ranks whose
  contribution that chunk holds (reduce-scatter sums them; all-gather copies the finished chunk).
  The bytes each rank has sent are counted in units of the full tensor N; the tests check the last
  frame against ``labkit.calc.comm`` and the contents against the collective's definition.
* :func:`zero_frames` one optimizer step of data parallelism under ZeRO stage 0-3 (Rajbhandari et
  al. 2020, arXiv:1910.02054): what each rank holds of weights, gradients and optimizer states,
  and which collective runs, phase by phase, with the bytes of ``calc.comm.dp_step_bytes``.
"""
from __future__ import annotations

from ..calc import comm

RING_OPS = ("all_gather", "reduce_scatter", "all_reduce")


def _frame(cells, sending, text, sent):
    return {"cells": [[sorted(c) for c in row] for row in cells], "sending": sending,
            "text": text, "sent": sent}


def _rs_steps(cells, n, frames, sent, label):
    for k in range(n - 1):
        moves = [(r, (r - k - 1) % n) for r in range(n)]          # rank r sends chunk (r-k-1) mod n
        incoming = [set(cells[r][c]) for r, c in moves]
        for (r, c), got in zip(moves, incoming):
            cells[(r + 1) % n][c] |= got                           # the next rank adds it to its own
        sent += 1.0 / n
        frames.append(_frame(cells, [[r, c] for r, c in moves],
                             f"{label} step {k + 1} of {n - 1}: each rank sends one chunk to the next, "
                             f"which adds it to its own", sent))
    return sent


def _ag_steps(cells, n, frames, sent, label, start):
    for k in range(n - 1):
        moves = [(r, (r + start - k) % n) for r in range(n)]       # forward the chunk finished last
        incoming = [set(cells[r][c]) for r, c in moves]
        for (r, c), got in zip(moves, incoming):
            cells[(r + 1) % n][c] = got                            # a copy, no arithmetic
        sent += 1.0 / n
        frames.append(_frame(cells, [[r, c] for r, c in moves],
                             f"{label} step {k + 1} of {n - 1}: each rank forwards a finished chunk; "
                             f"the next rank keeps a copy", sent))
    return sent


def ring_frames(op: str, n: int = 4) -> dict:
    """{"op", "n", "frames"}: frame 0 is the start; then one frame per ring step. ``sent`` is the
    bytes one rank has sent so far, as a fraction of the full tensor N."""
    if op not in RING_OPS:
        raise ValueError(f"op must be one of {RING_OPS}, got {op!r}")
    if isinstance(n, bool) or not isinstance(n, int) or not 2 <= n <= 8:
        raise ValueError(f"n must be an integer from 2 to 8, got {n!r}")
    if op == "all_gather":      # rank r starts with its own chunk r only
        cells = [[({r} if c == r else set()) for c in range(n)] for r in range(n)]
        frames = [_frame(cells, [], "Start: each rank holds one chunk of N / n, its own", 0.0)]
        _ag_steps(cells, n, frames, 0.0, "All-gather", start=0)
    else:                       # every rank holds a full-size contribution of its own
        cells = [[{r} for _ in range(n)] for r in range(n)]
        frames = [_frame(cells, [], "Start: each rank holds its own full tensor, cut into n chunks", 0.0)]
        sent = _rs_steps(cells, n, frames, 0.0, "Reduce-scatter")
        if op == "all_reduce":  # after RS rank r owns the whole sum of chunk r
            _ag_steps(cells, n, frames, sent, "All-gather", start=0)
    return {"op": op, "n": n, "frames": frames}


STATES = ("weights", "grads", "optim")


def _hold(stage, n):
    """What each rank keeps between steps: a list of chunk ids per state (all n = unsharded)."""
    full = list(range(n))
    return [{"weights": full if stage < 3 else [r], "grads": full if stage < 2 else [r],
             "optim": full if stage < 1 else [r]} for r in range(n)]


def zero_frames(stage: int, n: int = 4, param_bytes: float = 1.0) -> dict:
    """{"stage", "n", "frames"}: one optimizer step of ZeRO ``stage`` on n data-parallel ranks, one
    microbatch. Each frame: per rank the chunks of each state it holds, the phase, the collective and
    the bytes one rank has sent so far (``param_bytes`` P = the gradient size), from calc.comm."""
    if stage not in (0, 1, 2, 3):
        raise ValueError(f"stage must be 0, 1, 2 or 3, got {stage!r}")
    parts = comm.dp_step_bytes(param_bytes, n, stage, param_bytes, 1)
    full, held = list(range(n)), _hold(stage, n)
    frames, sent = [], 0.0

    def add(text, collective, ranks, extra=0.0):
        nonlocal sent
        sent += extra
        frames.append({"ranks": [dict(r) for r in ranks], "text": text, "collective": collective,
                       "sent": sent})

    add(f"ZeRO-{stage} between steps: what each rank keeps", "", held)
    fwd = [dict(r, weights=full) for r in held]
    if stage == 3:
        add("Forward: all-gather each layer's weights just before it runs, drop them after",
            "all_gather", fwd, parts["all_gather"] / 2)
    else:
        add("Forward: every rank runs the whole model on its own microbatch", "", fwd)
    bwd = [dict(r, weights=full, grads=full) for r in held]
    if stage == 3:
        add("Backward: gather the weights again, layer by layer", "all_gather", bwd, parts["all_gather"] / 2)
    else:
        add("Backward: each rank computes the gradient of every weight", "", bwd)
    if stage == 0:
        red = [dict(r, grads=full) for r in held]
        add("All-reduce the gradients: every rank gets the sum of all of them", "all_reduce", red,
            parts["all_reduce"])
    else:
        red = [dict(r, grads=[i]) for i, r in enumerate(held)]
        add("Reduce-scatter the gradients: each rank keeps the summed shard it updates",
            "reduce_scatter", red, parts["reduce_scatter"])
    upd = [dict(r, weights=(full if stage < 1 else r["weights"])) for r in red]
    add("Optimizer step: each rank updates " + ("every weight" if stage == 0 else "its own shard"),
        "", upd if stage == 0 else [dict(r, weights=[i] if stage == 3 else r["weights"]) for i, r in enumerate(upd)])
    if stage in (1, 2):
        add("All-gather the updated weights: every rank has the whole model again", "all_gather",
            [dict(r, weights=full, grads=held[i]["grads"]) for i, r in enumerate(red)], parts["all_gather"])
    return {"stage": stage, "n": n, "frames": frames}

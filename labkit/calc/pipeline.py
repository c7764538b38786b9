"""Pipeline bubble (chapters "Pipeline parallel" and "Interleaved pipeline").

With p stages and m microbatches, 1F1B (and GPipe) idle each stage for p-1 forward+backward slots
per step, while the useful work is m slots: bubble time / ideal time = (p-1)/m (Narayanan et al.
2021, Sec. 2.2.1). With v model chunks per stage (interleaved 1F1B) every slot is v times shorter,
so the bubble is (p-1)/(v*m) (Sec. 2.2.2). ``labkit.schedules.simulate`` must agree with this.
"""
from __future__ import annotations

from ..validate import positive_int


def bubble_fraction(p, m, v=1) -> float:
    """Bubble time divided by ideal compute time: (p-1)/(v*m).

    >>> bubble_fraction(4, 8), bubble_fraction(4, 8, v=2)
    (0.375, 0.1875)
    """
    for name, value in (("p", p), ("m", m), ("v", v)):
        positive_int(f"bubble_fraction: {name}", value)
    return (p - 1) / (v * m)


def bubble_share_of_step(p, m, v=1) -> float:
    """The bubble as a share of the whole step time: (p-1)/(v*m + p-1)."""
    b = bubble_fraction(p, m, v)
    return b / (1 + b)


def pipeline_layer_ranges(num_layers, pp, vp=1, first=None, last=None,
                          account_for_embedding=False, account_for_loss=False) -> list:
    """Transformer layers of every pipeline rank and model chunk, as Megatron-LM builds them.

    Returns ``ranges[rank][chunk] = (start, stop)`` (global layer indices, ``stop`` excluded; an
    empty chunk is ``(i, i)``). ``first`` / ``last`` are ``decoder_first_pipeline_num_layers`` /
    ``decoder_last_pipeline_num_layers`` (the remaining layers split evenly over the middle
    ranks); ``account_for_embedding`` / ``account_for_loss`` count the embedding / the loss as one
    more layer when splitting, and that slot stays empty on the first / last rank. With ``vp``
    chunks a rank's layers are split evenly into its chunks, chunk j of rank r coming after chunk
    j of ranks < r. Megatron-LM ``get_num_layers_to_build`` (transformer_block.py) and
    ``get_transformer_layer_offset`` (transformer_layer.py), commit d98e8a64. Raises ValueError
    with Megatron's rule when the split is impossible.

    >>> pipeline_layer_ranges(70, 12, account_for_embedding=True, account_for_loss=True)[0]
    [(0, 5)]
    >>> pipeline_layer_ranges(10, 3, first=2, last=4)
    [[(0, 2)], [(2, 6)], [(6, 10)]]
    """
    for name, value in (("num_layers", num_layers), ("pp", pp), ("vp", vp)):
        positive_int(f"pipeline_layer_ranges: {name}", value)
    uneven = first is not None or last is not None
    if uneven and (account_for_embedding or account_for_loss):
        raise ValueError("rule: decoder_first/last_pipeline_num_layers cannot be combined with "
                         "account_for_embedding/loss_in_pipeline_split (Megatron TransformerConfig)")
    if uneven:
        mid_layers, mid_ranks = num_layers, pp
        for name, n in (("decoder_first_pipeline_num_layers", first), ("decoder_last_pipeline_num_layers", last)):
            if n is None:
                continue
            if n <= 0 or n % vp:
                raise ValueError(f"rule: {name} positive and divisible by the virtual pipeline size; {n}, v={vp}")
            mid_layers, mid_ranks = mid_layers - n, mid_ranks - 1
        if pp == 1 or bool(mid_layers) != bool(mid_ranks) or mid_layers < 0:
            raise ValueError(f"rule: {mid_layers} middle layers remaining but {max(mid_ranks, 0)} middle "
                             f"pipeline stages (num_layers={num_layers}, PP={pp}, first={first}, last={last})")
        per_mid = mid_layers // mid_ranks if mid_ranks else 0
        if mid_ranks and (mid_layers % mid_ranks or per_mid % vp):
            raise ValueError(f"rule: layers of the middle stages divisible by the middle stages (and "
                             f"then by v={vp}); {mid_layers} layers over {mid_ranks} stages")
        counts = [per_mid] * pp
        if first is not None:
            counts[0] = first
        if last is not None:
            counts[-1] = last
        slots = [[c // vp] * vp for c in counts]
    else:
        total = num_layers + int(account_for_embedding) + int(account_for_loss)
        if total % pp or (total // pp) % vp:
            raise ValueError(f"rule: num_layers (+1 per account_for_* flag) divisible by PP and then by "
                             f"v; {total} over PP={pp}, v={vp}")
        per_chunk = total // pp // vp
        slots = [[per_chunk] * vp for _ in range(pp)]
        if account_for_embedding:
            slots[0][0] -= 1
        if account_for_loss:
            slots[-1][-1] -= 1
        if min(min(s) for s in slots) < 0:
            raise ValueError("rule: not enough layers in the first/last virtual stage for the embedding/loss")
    # layers are laid out chunk-major: all ranks' chunk 0, then all ranks' chunk 1, ...
    ranges, start = [[None] * vp for _ in range(pp)], 0
    for j in range(vp):
        for r in range(pp):
            ranges[r][j] = (start, start + slots[r][j])
            start += slots[r][j]
    assert start == num_layers, (start, num_layers)
    return ranges


def uneven_split_hint(num_layers: int, pp: int) -> str:
    """The Megatron argument(s) that would make ``num_layers`` split over ``pp`` stages."""
    if pp == 1:
        return ""
    hints = []
    for extra, args in ((1, "account_for_loss_in_pipeline_split"),
                        (2, "account_for_embedding_in_pipeline_split and account_for_loss_in_pipeline_split")):
        if (num_layers + extra) % pp == 0:
            hints.append(f"{args} (({num_layers}+{extra}) / {pp} = {(num_layers + extra) // pp} slots per stage)")
    per = -(-num_layers // pp)  # ceil: the middle stages get `per` layers, the first the rest
    first = num_layers - per * (pp - 1)
    if first > 0:
        hints.append(f"decoder_first_pipeline_num_layers={first} ({pp - 1} more stages of {per})")
    return " (Megatron allows it with " + ", or ".join(hints) + ")" if hints else ""

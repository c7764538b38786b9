"""Pipeline bubble (chapters "Pipeline parallel" and "Interleaved pipeline").

With p stages and m microbatches, 1F1B (and GPipe) idle each stage for p-1 forward+backward slots
per step, while the useful work is m slots: bubble time / ideal time = (p-1)/m (Narayanan et al.
2021, Sec. 2.2.1). With v model chunks per stage (interleaved 1F1B) every slot is v times shorter,
so the bubble is (p-1)/(v*m) (Sec. 2.2.2). ``labkit.schedules.simulate`` must agree with this.
"""
from __future__ import annotations


def bubble_fraction(p, m, v=1) -> float:
    """Bubble time divided by ideal compute time: (p-1)/(v*m).

    >>> bubble_fraction(4, 8), bubble_fraction(4, 8, v=2)
    (0.375, 0.1875)
    """
    for name, value in (("p", p), ("m", m), ("v", v)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"bubble_fraction: {name} must be a positive integer, got {value!r}")
    return (p - 1) / (v * m)


def bubble_share_of_step(p, m, v=1) -> float:
    """The bubble as a share of the whole step time: (p-1)/(v*m + p-1)."""
    b = bubble_fraction(p, m, v)
    return b / (1 + b)

"""Findings the fuzzer has already made and that are not fixed yet: reported as "known", not new.

A fuzzer that stops at the same crash every time finds nothing else; so each finding, once
shrunk and filed, gets an entry here: its kind, a predicate over the layout that matches its shrunk
reproducer and what it generalizes to, and where it is tracked. ``tests/test_fuzz.py`` keeps each
one's reproducer as a strict xfail: the day it is fixed the test fails, and the entry goes.
"""
from __future__ import annotations

# Empty since both of labkit's findings were fixed (chapter "Finding the bug nobody chose"):
# zero3_full_recompute (fuzz seed 0, 4th layout: a recomputed layer read parameters its ZeRO-3 unit had
# freed; data_parallel/fsdp.py) and moe_capacity_tp_sp (seed 100: the one-device reference counted
# expert capacity over the whole microbatch, each tp rank over its s/tp positions; reference.py).
# An entry: {"name", "kind", "what", "reproducer": labkit.train kwargs, "when": layout -> bool}.
KNOWN: list[dict] = []


def known(layout: dict, kind: str) -> str | None:
    """The name of the known finding ``layout`` (failing with ``kind``) matches, or None."""
    for k in KNOWN:
        if k["kind"] == kind and k["when"](layout):
            return k["name"]
    return None

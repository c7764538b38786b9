"""``labkit.fuzz``: the one-device oracle for every layout (chapter "Finding the bug nobody chose").

    result = labkit.fuzz.fuzz(seed=0, layouts=40)          # or minutes=30
    print(labkit.fuzz.summary(result))
    python -m labkit fuzz --seed 0 --layouts 40 [--implementation native] [--bug NAME]

    space.py    what is drawn (Hypothesis strategies over every axis and knob) and ``refusal``
    oracle.py   the bound (derived from the unit roundoff and the reduction sizes) and the comparisons
    run.py      the driver: draw, run, judge; references shared by shape
    shrink.py   a finding made minimal
    report.py   reproducer files, the one-line command, ``labkit diverge``'s report
"""
from __future__ import annotations

_LAZY = {"fuzz": "run", "Runner": "run", "draw_layouts": "run", "FuzzResult": "run",
         "layouts": "space", "refusal": "space", "describe": "space",
         "bound": "oracle", "compare": "oracle", "shrink": "shrink",
         "Finding": "report", "replay": "run", "summary": "report"}
__all__ = sorted(_LAZY)


def __getattr__(name):  # PEP 562: nothing heavy on ``import labkit.fuzz``
    if name in _LAZY:
        import importlib
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module 'labkit.fuzz' has no attribute {name!r}")

"""Low precision: how far a correct parallel run may drift from one device, and "noise or bug?".

Chapter "Low precision" (book/low-precision.ipynb). Issue 32, items 3 and 4.

    bounds     unit roundoff per format, Higham's summation bound, the derived band (pure)
    layouts    the layout families (DP, ZeRO, TP+SP, CP, PP/VPP, EP, composed) and a pair's family
    measure    envelopes measured with labkit.train (``python -m labkit.drift envelopes``)
    decide     within the envelope or outside it, and the step where it left (pure)
    cli        ``python -m labkit drift A B --layout-a ... --layout-b ... --precision bf16``
"""
from __future__ import annotations

_LAZY = {"derived_band": "bounds", "unit_roundoff": "bounds", "gamma": "bounds", "PRECISIONS": "bounds",
         "FAMILIES": "layouts", "family_of": "layouts", "parse_layout": "layouts",
         "envelopes": "measure", "decide": "decide", "Verdict": "decide", "load_envelopes": "decide"}
__all__ = sorted(_LAZY)


def __getattr__(name):
    if name in _LAZY:
        import importlib
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module 'labkit.drift' has no attribute {name!r}")

"""Debugging distributed training: the first divergence, planted bugs, hangs, NaNs, faults.

Chapter "When training goes wrong". Everything here ATTACHES to a run (DESIGN, "Measurement
attaches, never sits in the path"): ``labkit.train(..., probe=make)`` calls ``make(engine,
topo, groups, cfg)`` on every rank after the model is cut, ``labkit.reference.train_reference(...,
probe=make)`` calls ``make(model)``; the probe made is told ``begin(iteration)`` and ``end()``.

    first_divergence(world_size, **layout)  where a run first differs from one device (divergence.py)
    BUGS                                    planted bugs, selectable by name: inject="..." (bugs.py)
    hang_report / HANGS                     hangs as gloo really behaves, and how to find them (hangs.py)
    STRAGGLERS, detect                      planted slow ranks and links, and the detector that names
                                            them from one run's record (slowdowns.py, stragglers.py)
    check_nan                               Megatron's --check-for-nan-in-loss-and-grad (nan.py)
    GradHistory, crash_during_save          a reference-side gradient log; a save killed halfway

``labkit.debug.stacks`` is layer 1 (pure Python): the launcher's hang report reads stack dumps with it.
"""
from __future__ import annotations

_LAZY = {
    "first_divergence": "divergence", "Divergence": "divergence", "divergence_table": "divergence",
    "BUGS": "bugs", "assigned_bug": "bugs", "assignment": "bugs",
    "Recording": "fingerprints", "ReferenceRecording": "fingerprints",
    "HANGS": "hangs", "run_hang": "hangs", "flight_recorder_entries": "hangs",
    "check_nan": "nan", "plant_nan": "nan", "chain": "nan",
    "GradHistory": "probes", "crash_during_save": "probes",
    "waits_from_stacks": "stacks",
    "STRAGGLERS": "slowdowns", "run_straggler": "slowdowns", "detect": "stragglers", "StepClock": "stragglers",
}
__all__ = sorted(_LAZY)


def __getattr__(name):  # PEP 562: nothing heavy on ``import labkit.debug.stacks`` (the launcher's)
    if name in _LAZY:
        import importlib
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module 'labkit.debug' has no attribute {name!r}")

"""Which check module holds which exercise: the grader looks exercises up here by id.

Each lab's check module lists its exercises as :class:`~labkit.check.spec.Spec` objects in
``SPECS`` ({exercise id: Spec}). Ids are unique across the course (a test checks it). Every
lab's exercises are Specs now; a lab listed in ``IN_PROCESS`` (none) would be graded the older
way, by running its check cell inside the sandbox after the answers (``labkit.notebooks.grader``):
its printed ``[check]`` lines are the verdict, and its exercises are reported as ``"checked": "in-process"``.
"""
from __future__ import annotations

import importlib

MODULES = ("labkit.check.example", "labkit.check.collectives", "labkit.check.data_parallel",
           "labkit.check.tensor_parallel", "labkit.check.sequence_parallel", "labkit.check.pipeline",
           "labkit.check.context_parallel", "labkit.check.expert_parallel", "labkit.check.composition",
           "labkit.check.memory_knobs", "labkit.check.debugging", "labkit.check.resume", "labkit.check.native",
           "labkit.check.fuzzing", "labkit.check.fp8", "labkit.check.roofline")

# lab (the master's name without .ipynb) -> its check module, for the labs graded in-process
IN_PROCESS: dict = {}


def all_specs(modules=MODULES) -> dict:
    """{exercise id: Spec} of every module (a module that cannot be imported is skipped)."""
    found = {}
    for name in modules:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        for spec_id, spec in getattr(module, "SPECS", {}).items():
            if spec_id in found and found[spec_id] is not spec:
                raise ValueError(f"exercise id {spec_id!r} is defined by two check modules")
            found[spec_id] = spec
    return found


def find(exercise_id: str, modules=MODULES):
    """The Spec of ``exercise_id``, or None."""
    return all_specs(modules).get(exercise_id)

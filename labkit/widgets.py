"""ipywidgets front-ends over labkit.calc, for a notebook with a live kernel.

Each calculator is built from ``labkit.calc.report.FORMS`` (the inputs the book's calculators page
offers too) and answers with ``labkit.calc.report.calculate``. An invalid layout shows the broken
rule in the widget, never a traceback. Not for the rendered book: a widget's stored state renders
there as controls that look live and answer nothing. The book embeds explorers instead, which run
labkit.calc in the reader's browser (``{labkit-explorer} memory``, book/_ext/labkit_explorers.py).

    from labkit import widgets
    widgets.memory_widget()          # GPT-3 175B on 1024 A100s by default; change any input
    widgets.calculator("planner", nodes=16)
"""
from __future__ import annotations

import ipywidgets as w

from .calc.report import FORMS, calculate

STYLE = {"description_width": "initial"}


def _control(name, label, kind, default, choices):
    if kind == "bool":
        return w.Checkbox(value=bool(default), description=label, style=STYLE)
    if kind == "choice":
        return w.Dropdown(options=list(choices), value=default, description=label, style=STYLE)
    if kind == "float":
        return w.FloatText(value=float(default), description=label, style=STYLE)
    return w.IntText(value=int(default), description=label, style=STYLE)


def calculator(name: str, **initial) -> w.VBox:
    """A live calculator: inputs from FORMS[name] (overridden by ``initial``), an HTML answer."""
    if name not in FORMS:
        raise ValueError(f"unknown calculator {name!r}; choose one of {sorted(FORMS)}")
    unknown = set(initial) - {f[0] for f in FORMS[name]}
    if unknown:
        raise ValueError(f"calculator {name!r} has no inputs {sorted(unknown)}")
    controls = {}
    for field, label, kind, default, choices in FORMS[name]:
        controls[field] = _control(field, label, kind, initial.get(field, default), choices)
    answer = w.HTML()

    def update(_change=None):
        answer.value = calculate(name, {k: c.value for k, c in controls.items()})

    for c in controls.values():
        c.observe(update, names="value")
    update()
    grid = w.GridBox(list(controls.values()),
                     layout=w.Layout(grid_template_columns="repeat(3, minmax(14em, 1fr))"))
    box = w.VBox([grid, answer])
    box.answer, box.controls = answer, controls  # for tests and for reading the result
    return box


def batch_widget(**initial) -> w.VBox:
    """DP size, microbatches (= gradient accumulation), tokens per step, bubble."""
    return calculator("batch", **initial)


def memory_widget(**initial) -> w.VBox:
    """Memory per GPU per pipeline stage (stacked bars, GPU capacity line), FLOPs, MFU, bytes."""
    return calculator("memory", **initial)


def planner_widget(**initial) -> w.VBox:
    """Layouts that fit, ranked by predicted throughput, and why the winner wins."""
    return calculator("planner", **initial)

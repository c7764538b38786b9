"""Sphinx extension: ship labkit.calc's own sources with the book, for the static calculators.

The calculator page (book/calculators.md) runs labkit.calc in the browser with Pyodide, so the
formulas have a single source. At the end of an HTML build this copies ``labkit/__init__.py``,
``labkit/topology.py`` and ``labkit/calc/*.py`` to ``_static/labkit_src/`` and writes
``manifest.json`` (the list of files) for ``_static/calculators.js`` to load into Pyodide's
file system. Pure standard library; no network.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def sources() -> list[Path]:
    pkg = ROOT / "labkit"
    return [pkg / "__init__.py", pkg / "topology.py", *sorted((pkg / "calc").glob("*.py"))]


def copy_sources(app, exception):
    if exception is not None or app.builder.format != "html":
        return
    dest = Path(app.outdir) / "_static" / "labkit_src"
    files = []
    for src in sources():
        rel = src.relative_to(ROOT).as_posix()
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, target)
        files.append(rel)
    (dest / "manifest.json").write_text(json.dumps({"files": files}, indent=1))


def setup(app):
    app.connect("build-finished", copy_sources)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}

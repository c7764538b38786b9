"""Sphinx extension: ship labkit.calc's own sources with the book, for the static calculators.

The calculator page (book/calculators.md) and the memory explorer run labkit.calc in the browser
with Pyodide, in a Web Worker (``_static/explorers/calc-worker.js``), so the formulas have a single
source. At the end of an HTML build this copies ``labkit/__init__.py``, ``labkit/topology.py``,
``labkit/validate.py`` (the one integer check), ``labkit/calc/*.py``, stage placement and
``labkit_answers.py`` (this folder: the answers as data) to ``_static/labkit_src/`` and writes
``manifest.json`` (the list of files) for the worker to load into Pyodide's file system (the test
``test_calc_notorch.py`` imports them with nothing else on the path). Pure standard library; no network.

It also removes two JavaScript console errors the theme stack (Jupyter Book 1.0.4) prints on every
page, so that the browser test can demand a clean console: sphinx-thebe registers its inline
configuration script twice ("Identifier 'THEBE_JS_URL' has already been declared"; duplicate
scripts are dropped per page), and pydata-sphinx-theme starts with an empty colour mode ("Got
invalid theme mode"; the context's ``default_mode`` is set to "auto", the theme's own fallback).
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def sources() -> list[Path]:
    pkg = ROOT / "labkit"
    return [pkg / "__init__.py", pkg / "topology.py", pkg / "validate.py", *sorted((pkg / "calc").glob("*.py")),
            pkg / "pipeline_parallel" / "__init__.py", pkg / "pipeline_parallel" / "placement.py",  # stage placement
            ROOT / "book" / "_ext" / "labkit_answers.py"]


def copy_sources(app, exception):
    if exception is not None or app.builder.format != "html":
        return
    dest = Path(app.outdir) / "_static" / "labkit_src"
    files = []
    for src in sources():
        rel = src.name if src.parent == HERE else src.relative_to(ROOT).as_posix()
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, target)
        files.append(rel)
    (dest / "manifest.json").write_text(json.dumps({"files": files}, indent=1))


def default_mode(app, config):
    # pydata-sphinx-theme reads ``default_mode`` from the template context (html_context)
    if not config.html_context.get("default_mode"):
        config.html_context = {**config.html_context, "default_mode": "auto"}


def dedupe_scripts(app, pagename, templatename, context, doctree):
    seen, unique = set(), []
    for script in context.get("script_files", []):
        name = getattr(script, "filename", script) or ""  # an inline script has '' or None
        key = (str(name), repr(sorted(getattr(script, "attributes", {}).items())))
        if key not in seen:
            seen.add(key)
            unique.append(script)
    context["script_files"][:] = unique  # in place: later handlers may still append to it


def setup(app):
    app.connect("config-inited", default_mode)
    app.connect("html-page-context", dedupe_scripts, priority=900)  # after the other handlers
    app.connect("build-finished", copy_sources)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}

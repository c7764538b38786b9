"""Sphinx extension: the ``labkit-explorer`` directive, and the data the explorers run on.

Any page (MyST Markdown, or a Markdown cell of a notebook) embeds an explorer::

    ```{labkit-explorer} pipeline
    :schedule: interleaved
    :p: 4
    :m: 8
    :v: 2
    :caption: What to look at.
    ```

Three explorers, all answering on the static page with no kernel (``_static/explorers/*.js``):

* ``pipeline``  a schedule stepper over a grid of (schedule, p, m, v) computed at build time
  (``labkit_pipeline_grid.py``),
  with ``labkit.pipeline_parallel.schedules`` and ``simulate`` (``_static/explorers/pipeline.json``).
* ``memory``    bytes per GPU per pipeline stage from ``labkit.calc`` (``labkit_answers.memory``):
  the answer for the page's inputs and for every change of one input are computed here; any other
  input (any whole numbers: 24 GPUs, TP 3) is answered at once by labkit.calc's closed form
  transcribed in the page (``memory-formula.js``, checked against ``memory()`` by the browser
  test), then by the same Python function in a Web Worker running Pyodide, which starts on idle
  after first paint and adds Megatron-LM's estimate.
* ``rank-grid`` Megatron's groups on nodes of 8 GPUs for any whole sizes (24 GPUs, TP 3):
  JavaScript mirroring ``labkit.topology`` (``rankgrid.js``; tests/test_browser_book.py proves it
  equal to Topology on a grid of layouts and on random non-power-of-two ones).

Options are checked here, so a bad value fails the build (``-W``) with the allowed range. The
scripts are added only to pages that hold an explorer.
"""
from __future__ import annotations

import hashlib
import html
import json
from pathlib import Path

from docutils import nodes
from docutils.parsers.rst import Directive, directives

import labkit_answers as answers
from labkit_pipeline_grid import (M_RANGE, P_RANGE, SCHEDULES, V_RANGE, case_key, encode_case,  # noqa: F401
                                  pipeline_grid)

STATIC = "explorers"   # folder under _static/ (book/_static/explorers/ holds the scripts)
SCRIPTS = ("explorers.js", "pipeline.js", "memory-formula.js", "memory.js", "rankgrid.js")

# -- the directive --------------------------------------------------------------------------------
def _int_in(lo: int, hi: int):
    def conv(text):
        value = directives.nonnegative_int(text)
        if not lo <= value <= hi:
            raise ValueError(f"must be between {lo} and {hi}, got {value}")
        return value
    return conv


def _choice(values):
    def conv(text):
        value = (text or "").strip()
        if value not in values:
            raise ValueError(f"must be one of {', '.join(map(str, values))}; got {value!r}")
        return value
    return conv


def _bool(text):
    value = (text or "true").strip().lower()
    if value not in ("true", "false", "yes", "no", "1", "0"):
        raise ValueError(f"must be true or false, got {text!r}")
    return value in ("true", "yes", "1")


def _memory_option(name):
    choices = dict((n, c) for n, _l, c in answers.MEMORY_CONTROLS)[name]
    if all(isinstance(c, bool) for c in choices):
        return _bool
    if all(isinstance(c, int) for c in choices):
        # the page takes any whole number here (memory.js NUMBERS); the build answers it with labkit.calc
        return _int_in(1, 1 << 20) if name != "zero_stage" else _choice_int(choices)
    return _choice(choices)


# short option name -> labkit_answers.MEMORY_DEFAULTS key
MEMORY_OPTIONS = {"model": "model", "seq_length": "seq_length", "micro_batch_size": "micro_batch_size",
                  "tp": "tensor_model_parallel_size", "sp": "sequence_parallel",
                  "pp": "pipeline_model_parallel_size", "vpp": "virtual_stages",
                  "cp": "context_parallel_size", "ep": "expert_model_parallel_size",
                  "dp": "data_parallel_size", "m": "num_microbatches", "zero": "zero_stage",
                  "recompute": "recompute_granularity", "precision": "precision",
                  "attention": "attention", "gpu": "gpu"}
RANK_AXES = ("tp", "cp", "dp", "pp", "ep", "edp")
RANK_MAX = 512   # the rank grid takes any whole number up to this (rankgrid.js MAX_WORLD)


def _choice_int(values):
    def conv(text):
        value = directives.nonnegative_int(text)
        if value not in values:
            raise ValueError(f"must be one of {', '.join(map(str, values))}; got {value}")
        return value
    return conv


class LabkitExplorer(Directive):
    """``{labkit-explorer} pipeline|memory|rank-grid`` with options (see the module docstring)."""

    required_arguments = 1
    has_content = False
    # Options are read as text here and converted per explorer in run(): the same name (m, tp)
    # means different things, with different ranges, in different explorers.
    CONVERTERS = {
        "pipeline": {"schedule": _choice(SCHEDULES), "p": _int_in(2, 8), "m": _int_in(1, 16), "v": _int_in(1, 4)},
        "memory": {opt: _memory_option(key) for opt, key in MEMORY_OPTIONS.items()},
        "rank-grid": {"world_size": _int_in(1, RANK_MAX), "tp": _int_in(1, RANK_MAX),
                      "cp": _int_in(1, RANK_MAX), "ep": _int_in(1, RANK_MAX), "pp": _int_in(1, RANK_MAX),
                      "show": _choice(RANK_AXES)},
    }
    option_spec = {"caption": directives.unchanged,
                   **{name: directives.unchanged for conv in CONVERTERS.values() for name in conv}}

    def run(self):
        kind = self.arguments[0]
        if kind not in self.CONVERTERS:
            raise self.error(f"labkit-explorer: unknown explorer {kind!r}; choose one of "
                             f"{', '.join(self.CONVERTERS)}")
        convert = self.CONVERTERS[kind]
        extra = set(self.options) - set(convert) - {"caption"}
        if extra:
            raise self.error(f"labkit-explorer {kind}: options {sorted(extra)} do not apply; "
                             f"allowed: {sorted(convert)} and caption")
        for name in set(self.options) & set(convert):
            try:
                self.options[name] = convert[name](self.options[name])
            except ValueError as err:
                raise self.error(f"labkit-explorer {kind}: option :{name}: {err}")
        env = self.state.document.settings.env
        try:
            config, data = getattr(self, "_" + kind.replace("-", "_"))(env)
        except ValueError as err:
            raise self.error(f"labkit-explorer {kind}: {err}")
        serial = env.new_serialno("labkit-explorer")
        ident = f"lx-{env.docname.replace('/', '-')}-{serial}"
        pages = getattr(env, "labkit_explorer_pages", set())
        pages.add(env.docname)
        env.labkit_explorer_pages = pages
        caption = self.options.get("caption", "")
        text = (f'<figure class="labkit-explorer" id="{ident}" data-explorer="{kind}" '
                f'data-config="{html.escape(json.dumps(config, sort_keys=True))}">'
                f'<div class="lx-body"><p class="lx-noscript">This explorer runs in your browser: '
                f'it needs JavaScript.</p></div>'
                + (f'<figcaption>{html.escape(caption)}</figcaption>' if caption else "")
                + (f'<script type="application/json" class="lx-data">{_json_html(data)}</script>'
                   if data is not None else "")
                + f'</figure><script>labkitExplorers.mount("{ident}")</script>')
        return [nodes.raw("", text, format="html")]

    # -- per explorer: (config for the page, build-time data embedded in the page) --------------
    def _pipeline(self, env):
        o = self.options
        name = o.get("schedule", "1f1b")
        v = o.get("v", 2 if name == "interleaved" else 1)
        if v > 1 and name != "interleaved":
            raise ValueError(f":v: {v} applies to the interleaved schedule only, not {name}")
        p, m = o.get("p", 4), o.get("m", 8)
        if name == "interleaved" and v == 1:
            name = "1f1b"
        case = encode_case(name, p, m, v)
        if "error" in case:
            raise ValueError(case["error"])
        return {"schedule": name, "p": p, "m": m, "v": v}, {"key": case_key(name, p, m, v), "case": case}

    def _memory(self, env):
        values = dict(answers.MEMORY_DEFAULTS)
        for opt, key in MEMORY_OPTIONS.items():
            if opt in self.options:
                values[key] = self.options[opt]
        first = answers.memory(values)
        if "error" in first:
            raise ValueError(f"the page's own inputs break a rule: {first['error']}")
        digest = hashlib.sha1(answers.key(values).encode()).hexdigest()[:12]
        wanted = getattr(env, "labkit_explorer_memory", {})
        wanted[digest] = values
        env.labkit_explorer_memory = wanted
        config = {"values": values, "cache": f"memory-{digest}.json",
                  "controls": [[n, label, choices] for n, label, choices in answers.MEMORY_CONTROLS]}
        return config, {"key": answers.key(values), "answer": first, "formula": answers.memory_page_data()}

    def _rank_grid(self, env):
        from labkit.topology import Topology
        o = self.options
        world = o.get("world_size", 16)
        sizes = {a: o.get(a, 1) for a in ("tp", "cp", "ep", "pp")}
        if "tp" not in o and "pp" not in o and "world_size" not in o:
            sizes.update(tp=2, pp=2)
        topo = Topology(world, tp=sizes["tp"], pp=sizes["pp"], cp=sizes["cp"], ep=sizes["ep"])
        return {"world_size": world, **sizes, "dp": topo.dp, "show": o.get("show", "tp")}, None


class LabkitCalculator(Directive):
    """``{labkit-calculator} batch|memory|planner``: a form of labkit.calc inputs and its answer.

    The answer for the default inputs, and for every change of one choice field from them, is
    computed here (first paint); any other input in the page's Web Worker (Pyodide).
    """

    required_arguments = 1
    has_content = False
    CACHE_INTS = {"world_size": (8, 16, 32, 64, 128, 256, 512, 1024, 2048),
                  "tensor_model_parallel_size": (1, 2, 4, 8), "pipeline_model_parallel_size": (1, 2, 4, 8, 16, 32),
                  "context_parallel_size": (1, 2, 4, 8), "micro_batch_size": (1, 2, 4, 8),
                  "nodes": (8, 16, 64, 128)}

    def run(self):
        name = self.arguments[0]
        forms = answers.forms()
        if name not in answers.CALCULATORS:
            raise self.error(f"labkit-calculator: unknown calculator {name!r}; choose one of "
                             f"{', '.join(answers.CALCULATORS)}")
        env = self.state.document.settings.env
        defaults = answers.form_defaults(name)
        first = answers.calculate(name, defaults)
        if "error" in first:
            raise self.error(f"labkit-calculator {name}: the defaults break a rule: {first['error']}")
        cache = {answers.key(defaults): first}
        for field, _label, kind, _default, choices in forms[name]:
            options = choices if kind == "choice" else [True, False] if kind == "bool" else (
                self.CACHE_INTS.get(field, ()) if name != "planner" or field == "nodes" else ())
            if name == "planner" and kind == "choice" and field == "model":
                options = ()   # a plan per model is seconds of build time: Python answers those
            for value in options:
                v = {**defaults, field: value}
                cache.setdefault(answers.key(v), answers.calculate(name, v))
        serial = env.new_serialno("labkit-explorer")
        ident = f"lc-{env.docname.replace('/', '-')}-{serial}"
        pages = getattr(env, "labkit_explorer_pages", set())
        pages.add(env.docname)
        env.labkit_explorer_pages = pages
        calcs = getattr(env, "labkit_calculator_pages", set())
        calcs.add(env.docname)
        env.labkit_calculator_pages = calcs
        data = {"name": name, "fields": forms[name], "defaults": defaults, "cache": cache}
        text = (f'<div class="labkit-calc" id="{ident}" data-calc="{name}"><p class="lx-noscript">This '
                f'calculator runs in your browser: it needs JavaScript.</p>'
                f'<script type="application/json" class="lx-data">{_json_html(data)}</script></div>'
                f'<script>labkitCalculators.mount("{ident}")</script>')
        return [nodes.raw("", text, format="html")]


def _json_html(data) -> str:
    """JSON safe inside <script>: no "</" (ends the element), no "<!--"."""
    return json.dumps(data, separators=(",", ":")).replace("</", "<\\/").replace("<!--", "<\\!--")


# -- events ---------------------------------------------------------------------------------------
def purge(app, env, docname):
    for attr in ("labkit_explorer_pages", "labkit_calculator_pages"):
        getattr(env, attr, set()).discard(docname)


def merge(app, env, docnames, other):
    env.labkit_explorer_pages = getattr(env, "labkit_explorer_pages", set()) | getattr(
        other, "labkit_explorer_pages", set())
    env.labkit_calculator_pages = getattr(env, "labkit_calculator_pages", set()) | getattr(
        other, "labkit_calculator_pages", set())
    env.labkit_explorer_memory = {**getattr(env, "labkit_explorer_memory", {}),
                                  **getattr(other, "labkit_explorer_memory", {})}


def page_assets(app, pagename, templatename, context, doctree):
    """Explorer scripts and styles on the pages that hold an explorer, and only there."""
    if pagename in getattr(app.env, "labkit_explorer_pages", set()):
        app.add_css_file(f"{STATIC}/explorers.css")
        for name in SCRIPTS:   # blocking, in <head>: each explorer mounts where it stands
            app.add_js_file(f"{STATIC}/{name}")
    if pagename in getattr(app.env, "labkit_calculator_pages", set()):
        app.add_js_file(f"{STATIC}/calculators.js")


def write_data(app, exception):
    if exception is not None or app.builder.format != "html":
        return
    out = Path(app.outdir) / "_static" / STATIC
    out.mkdir(parents=True, exist_ok=True)
    (out / "pipeline.json").write_text(json.dumps(pipeline_grid(), separators=(",", ":")))
    for digest, values in getattr(app.env, "labkit_explorer_memory", {}).items():
        cache = answers.memory_single_changes(values)
        (out / f"memory-{digest}.json").write_text(json.dumps(cache, separators=(",", ":")))


def setup(app):
    app.add_directive("labkit-explorer", LabkitExplorer)
    app.add_directive("labkit-calculator", LabkitCalculator)
    app.connect("env-purge-doc", purge)
    app.connect("env-merge-info", merge)
    app.connect("html-page-context", page_assets)
    app.connect("build-finished", write_data)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True,
            "env_version": 1}

"""Sphinx extension: the roofline explorer and the moving pictures (chapter "Where the time goes",
"Collectives", "Data parallelism").

    ```{labkit-roofline}
    :caption: What to look at.
    ```

    ```{labkit-player} all_reduce
    :n: 4
    :caption: What to look at.
    ```

``labkit-roofline`` embeds the GPUs (``labkit.calc.CLUSTERS``) and models (``labkit.calc.MODELS``) it
offers; ``_static/moving/roofline.js`` computes the ops of a layer, their intensities and the
crossovers in the page, in closed form (tests/test_browser_roofline.py checks them against
``labkit.calc.roofline`` on random layouts). ``labkit-player`` embeds the frames that
``labkit.figures.frames`` computes at build time (a ring collective or a ZeRO stage); the player
(``_static/moving/player.js``) steps through them, plays them only when asked or, if the reader's
system allows motion, when scrolled into view.
"""
from __future__ import annotations

import json

from docutils import nodes
from docutils.parsers.rst import Directive, directives

import labkit.calc as calc
from labkit.figures import frames

STATIC = "moving"
CLUSTERS = ("dgx-a100", "dgx-h100", "dgx-h200", "dgx-b200")
MODELS = ("llama3-8b", "llama3-70b", "gpt3-175b", "mixtral-8x7b", "deepseek-moe-16b")
PLAYS = frames.RING_OPS + ("zero-0", "zero-1", "zero-2", "zero-3", "zero")


def _json_html(data) -> str:
    return json.dumps(data, separators=(",", ":")).replace("</", "<\\/").replace("<!--", "<\\!--")


def _mounted(directive, prefix: str, kind: str, mount: str, attrs: str, noscript: str, data) -> list:
    """The raw HTML of one figure a script mounts: its data as JSON, a line for readers without
    JavaScript, the caption, and the mount call (the roofline explorer and the players)."""
    env = directive.state.document.settings.env
    _mark(env, "labkit_moving_pages")
    ident = f"{prefix}-{env.docname.replace('/', '-')}-{env.new_serialno(kind)}"
    caption = directive.options.get("caption", "")
    text = (f'<figure class="labkit-explorer {kind}" id="{ident}"{attrs}>'
            f'<p class="lx-noscript">{noscript}</p>'
            f'<script type="application/json" class="lx-data">{_json_html(data)}</script>'
            f'<figcaption>{caption}</figcaption></figure>'
            f'<script>{mount}.mount("{ident}")</script>')
    return [nodes.raw("", text, format="html")]


def roofline_data() -> dict:
    gpus = {}
    for key in CLUSTERS:
        c = calc.CLUSTERS[key]
        gpus[key] = {"label": f"{c.gpu.name} ({key})", "peak": c.gpu.peak_flops, "hbm": c.gpu.hbm_bandwidth,
                     "nvlink": c.intra_node_bandwidth, "nic": c.inter_node_bandwidth,
                     "gpus_per_node": c.gpus_per_node}
    models = {}
    for key in MODELS:
        m = calc.MODELS[key]
        models[key] = {"h": m.hidden_size, "a": m.num_attention_heads, "g": m.query_groups,
                       "d": m.kv_channels, "ffn": m.ffn_hidden_size, "swiglu": m.swiglu, "s": m.seq_length,
                       "E": m.num_experts or 0, "k": m.moe_router_topk, "moe_ffn": m.moe_ffn_hidden_size or 0}
    return {"gpus": gpus, "models": models,
            "defaults": {"gpu": "dgx-h100", "model": "llama3-70b", "s": 8192, "b": 1, "m": 8,
                         "tp": 8, "cp": 1, "ep": 1, "dp": 16, "fsdp": False}}


def _mark(env, attr):
    pages = getattr(env, attr, set())
    pages.add(env.docname)
    setattr(env, attr, pages)


class LabkitRoofline(Directive):
    has_content = False
    option_spec = {"caption": directives.unchanged}

    def run(self):
        return _mounted(self, "lr", "labkit-roofline", "labkitRoofline", "",
                        "This explorer runs in your browser: it needs JavaScript. The figures above show "
                        "the same roofline for the default layout.", roofline_data())


def _play_n(text):
    value = directives.nonnegative_int(text)
    if not 2 <= value <= 8:
        raise ValueError(f"must be between 2 and 8, got {value}")
    return value


class LabkitPlayer(Directive):
    required_arguments = 1
    has_content = False
    option_spec = {"n": _play_n, "caption": directives.unchanged}

    def run(self):
        what = self.arguments[0]
        if what not in PLAYS:
            raise self.error(f"labkit-player: unknown picture {what!r}; choose one of {', '.join(PLAYS)}")
        n = self.options.get("n", 4)
        if what in frames.RING_OPS:
            data = {"kind": "ring", **frames.ring_frames(what, n)}
        elif what == "zero":
            data = {"kind": "zero", "n": n, "stages": [frames.zero_frames(s, n) for s in range(4)]}
        else:
            data = {"kind": "zero", "n": n, "stages": [frames.zero_frames(int(what[-1]), n)]}
        return _mounted(self, "lp", "labkit-player", "labkitPlayer", f' data-play="{what}"',
                        "This picture moves in your browser: it needs JavaScript.", data)


def purge(app, env, docname):
    getattr(env, "labkit_moving_pages", set()).discard(docname)


def merge(app, env, docnames, other):
    env.labkit_moving_pages = getattr(env, "labkit_moving_pages", set()) | getattr(
        other, "labkit_moving_pages", set())


def page_assets(app, pagename, templatename, context, doctree):
    if pagename in getattr(app.env, "labkit_moving_pages", set()):
        app.add_css_file("explorers/explorers.css")
        app.add_css_file(f"{STATIC}/moving.css")
        app.add_js_file(f"{STATIC}/roofline.js")
        app.add_js_file(f"{STATIC}/player.js")


def setup(app):
    app.add_directive("labkit-roofline", LabkitRoofline)
    app.add_directive("labkit-player", LabkitPlayer)
    app.connect("env-purge-doc", purge)
    app.connect("env-merge-info", merge)
    app.connect("html-page-context", page_assets)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True, "env_version": 1}

"""Sphinx extension: the theme made light and phone-safe (issue "The book as its readers meet it").

The theme stack (Jupyter Book 1 = sphinx-book-theme on pydata-sphinx-theme) ships every page with
assets the book does not use. After an HTML build this

* replaces Font Awesome's 1.49 MB script (which swaps ``<i class="fa-solid fa-bars">`` for SVGs)
  by ``_static/labkit-icons.css``: the few icons the pages name, drawn as CSS masks from the same
  paths (Font Awesome Free, CC BY 4.0, read from the theme's own copy). The theme's icon font stays:
  its CSS draws admonition and link icons with it, and a browser fetches it (156 KB) only for a
  page that shows one;
* drops Sphinx's search script and 120 KB index from every page but the search page (the theme's
  search box submits to search.html, where they stay);
* drops sphinx-thebe (no page has a launch button) and its inline configuration;
* deletes the ipywidgets embed manager (``_static/jupyter-widgets/``, 4.4 MB) from the build when no
  page needs it, so no page can load it (it also threw MathJax 2 "Queue" errors under MathJax 3);
* adds ``_static/labkit-book.css`` to every page: nothing wider than a 390 px screen (long inline
  code wraps, tables and equations scroll inside their own box, images shrink), and
  ``_static/labkit-scroll-cue.js``: a table that scrolls sideways says so (a cue line and an edge
  shadow), so a phone reader knows the decisive columns are there.

A theme upgrade that moves these files fails the build with a message naming what is missing.
"""
from __future__ import annotations

import re
import shutil
from pathlib import Path

from sphinx.util import logging

log = logging.getLogger(__name__)
FA_SCRIPT = re.compile(r'\s*<script defer src="[^"]*_static/scripts/fontawesome\.js[^"]*"></script>')
SEARCH_SCRIPTS = re.compile(r'\s*<script src="[^"]*(?:_static/searchtools\.js|_static/language_data\.js|'
                            r'searchindex\.js)"></script>')
ICON_CLASS = re.compile(r'class="([^"]*\bfa-[^"]*)"')
NOT_ICONS = {"fa-solid", "fa-regular", "fa-brands", "fa-lg", "fa-xl", "fa-2x", "fa-fw", "fa-classic"}


def solid_icons(fontawesome_js: str) -> dict:
    """{name: (width, height, svg path)} of Font Awesome's solid pack, read from its script."""
    end = fontawesome_js.find('d("fas",p)')
    start = fontawesome_js.rfind("var p={", 0, end)
    if end < 0 or start < 0:
        raise ValueError("Font Awesome's solid pack ('var p={...}; d(\"fas\",p)') not found")
    pack = fontawesome_js[start:end]
    icons = {}
    for m in re.finditer(r'(?:"([\w-]+)"|(\w+)):\[(\d+),(\d+),\[[^\]]*\],"[0-9a-f]+","((?:[^"\\]|\\.)*)"\]', pack):
        icons[m.group(1) or m.group(2)] = (int(m.group(3)), int(m.group(4)), m.group(5))
    return icons


def icons_css(names, icons: dict) -> str:
    lines = ["/* Icons the theme names, as CSS masks (Font Awesome Free 6, solid; CC BY 4.0,",
             "   https://fontawesome.com/license/free): no icon script, no icon font. */",
             ".fa-solid, .fas { font-family: inherit !important; font-style: normal; }",
             ".fa-solid::before, .fas::before { content: \"\" !important; display: inline-block; height: 1em;"
             " width: var(--lx-w, 1em); vertical-align: -0.125em; background-color: currentColor;"
             " -webkit-mask: var(--lx-icon) center / contain no-repeat; mask: var(--lx-icon) center / contain no-repeat; }"]
    for name in sorted(names):
        w, h, path = icons[name]
        svg = f"<svg xmlns='http://www.w3.org/2000/svg' viewBox='0 0 {w} {h}'><path d='{path}'/></svg>"
        url = svg.replace("#", "%23").replace("<", "%3C").replace(">", "%3E").replace('"', "%22")
        lines.append(f'.fa-{name} {{ --lx-w: {w / h:.4f}em; --lx-icon: url("data:image/svg+xml,{url}"); }}')
    return "\n".join(lines) + "\n"


def drop_thebe(app, pagename, templatename, context, doctree):
    scripts = context.get("script_files", [])
    keep = [s for s in scripts if "thebe" not in str(getattr(s, "filename", s) or "").lower()
            and "THEBE" not in str(getattr(s, "attributes", {}).get("body", ""))]
    scripts[:] = keep
    css = context.get("css_files", [])
    css[:] = [c for c in css if "thebe" not in str(getattr(c, "filename", c) or "").lower()]


def finish(app, exception):
    if exception is not None or app.builder.format != "html":
        return
    out = Path(app.outdir)
    static = out / "_static"
    fa = static / "scripts" / "fontawesome.js"
    pages = sorted(p for p in out.rglob("*.html") if "_static" not in p.relative_to(out).parts)
    names, widgets = set(), False
    for page in pages:
        text = page.read_text()
        for classes in ICON_CLASS.findall(text):
            names.update(c[3:] for c in classes.split() if c.startswith("fa-") and c not in NOT_ICONS)
        widgets = widgets or "jupyter-widgets/embed-amd.js" in text
        new = FA_SCRIPT.sub("", text)
        if page.name != "search.html":
            new = SEARCH_SCRIPTS.sub("", new)
        if new != text:
            page.write_text(new)
    if fa.exists():
        icons = solid_icons(fa.read_text())
        missing = sorted(n for n in names if n not in icons)
        if missing:
            log.warning(f"labkit_theme: icons {missing} are not in Font Awesome's solid pack; "
                        f"they will not show")
        (static / "labkit-icons.css").write_text(icons_css(names - set(missing), icons))
        for f in (fa, fa.with_suffix(".js.map"), fa.with_name("fontawesome.js.LICENSE.txt")):
            f.unlink(missing_ok=True)
    elif not (static / "labkit-icons.css").exists():
        log.warning("labkit_theme: the theme's scripts/fontawesome.js was not found: no icons")
    if not widgets:
        shutil.rmtree(static / "jupyter-widgets", ignore_errors=True)


def setup(app):
    app.add_css_file("labkit-book.css")
    app.add_css_file("labkit-icons.css")
    app.add_js_file("labkit-scroll-cue.js", loading_method="defer")   # wide tables say they scroll
    app.connect("html-page-context", drop_thebe, priority=950)
    app.connect("build-finished", finish)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}

"""The rendered book reads offline: no page loads a script or a stylesheet from another site.

Equations are drawn by the MathJax 3 copy under book/_static/mathjax/ (``mathjax_path`` in
_config.yml), Pyodide by the copy under book/_static/pyodide/. The configuration tests need no
build. The built-HTML test reads an existing build: ``_build/html`` (``jupyter-book build .``) or
the folder named by ``LABKIT_BOOK_HTML`` (e.g. a build with ``--path-output``); without one it is
skipped and says why (building the book is CI's first step, not a unit test's).
"""
from __future__ import annotations

import json
import os
import re
from html.parser import HTMLParser
from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml", reason="the book tools (requirements.txt) are not installed")

ROOT = Path(__file__).resolve().parents[1]
MATHJAX = ROOT / "book" / "_static" / "mathjax"


def _config() -> dict:
    return yaml.safe_load((ROOT / "_config.yml").read_text())["sphinx"]["config"]


def test_config_loads_the_vendored_mathjax():
    config = _config()
    path = config["mathjax_path"]
    assert not re.match(r"^(https?:)?//", path), f"mathjax_path is a remote URL: {path}"
    assert "book/_static" in config["html_static_path"]
    assert (MATHJAX / "tex-mml-chtml.js").exists() and path == "mathjax/tex-mml-chtml.js"


def test_vendored_mathjax_is_whole_and_licensed():
    version = json.loads((MATHJAX / "package.json").read_text())["version"]
    assert version.startswith("3.")
    head = (MATHJAX / "tex-mml-chtml.js").read_text()[:200_000]
    assert f'"{version}"' in head, f"tex-mml-chtml.js is not MathJax {version}"
    assert "Apache License" in (MATHJAX / "LICENSE").read_text()
    fonts = list((MATHJAX / "output" / "chtml" / "fonts" / "woff-v2").glob("*.woff"))
    assert len(fonts) >= 20, "the CommonHTML fonts are missing"
    assert (MATHJAX / "input" / "tex" / "extensions" / "color.js").exists()  # autoloaded by \color


class _Refs(HTMLParser):
    def __init__(self):
        super().__init__()
        self.scripts, self.styles = [], []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "script" and a.get("src"):
            self.scripts.append(a["src"])
        if tag == "link" and "stylesheet" in (a.get("rel") or "") and a.get("href"):
            self.styles.append(a["href"])


def _built_html() -> Path | None:
    for folder in (os.environ.get("LABKIT_BOOK_HTML"), ROOT / "_build" / "html"):
        if folder and (Path(folder) / "book" / "intro.html").exists():
            return Path(folder)
    return None


def test_built_pages_load_nothing_from_other_sites():
    html = _built_html()
    if html is None:
        pytest.skip("no built book: run `jupyter-book build .` (or set LABKIT_BOOK_HTML to a build's html/)")
    pages = sorted(p for p in html.rglob("*.html") if "_static" not in p.relative_to(html).parts)
    math_pages = 0
    for page in pages:
        refs = _Refs()
        refs.feed(page.read_text(errors="replace"))
        remote = [u for u in refs.scripts + refs.styles if re.match(r"^(https?:)?//", u)]
        assert not remote, f"{page.relative_to(html)} loads {remote}"
        for src in refs.scripts + refs.styles:   # every local script and stylesheet exists
            target = (page.parent / src.split("?")[0].split("#")[0]).resolve()
            assert target.exists(), f"{page.relative_to(html)}: {src} is not in the build"
        mathjax = [s for s in refs.scripts if "mathjax" in s.lower()]
        if mathjax:
            math_pages += 1
            assert all(s.split("?")[0].endswith("_static/mathjax/tex-mml-chtml.js") for s in mathjax), mathjax
    assert math_pages > 0, "no page loads MathJax: equations would not render"

"""Each chapter's main path reads in one sitting (issue 36, round 2: "half the reading for the same
content"): at most 4,000 words of prose a reader meets without opening anything.

What counts (``main_path_words``): the words of a chapter's markdown (the markdown cells of its
notebook, or its .md file), a word being a whitespace-separated token with a letter or digit in it.
What does not count, because a reader passes it folded or does not read it as prose:

* the body of a ``{dropdown}`` directive and of an admonition with ``:class: dropdown`` (fenced with
  backticks or colons, nested or not): derivations, logs and long tables live there;
* fenced code blocks (```` ```python ````, ```` ```text ````, ``{code-block}``...) and the bodies of
  the book's own directives (``{labkit-explorer}``...: options, not prose);
* math: ``$$...$$`` blocks, ``{math}`` directives and inline ``$...$``;
* table rows (lines that start with ``|``), HTML comments, MyST targets ``(name)=``, directive
  option lines (``:class: tip``), link URLs (``[text](url)`` counts its text) and role names;
* the title on a directive's opening line (a dropdown's button, an admonition's heading).

A notebook's visible plain-text outputs count too (``visible_output_words``): a log printed on the
main path is read like prose, so a long one goes under ``hide-output`` (folded, "Show code cell
output") with a sentence above it saying what it shows. Not counted: code, figures (their captions live
in cell metadata), HTML tables, and outputs of cells tagged ``hide-output`` or ``remove-output``.
"""
import json
import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
LIMIT = 4000
NOT_CHAPTERS = {"Start here", "Reference"}      # as in test_book_cells: the pages that are not chapters

FENCE_OPEN = re.compile(r"^\s*(`{3,}|~{3,}|:{3,})\s*(\{[\w:-]+\})?(.*)$")
# Directives whose body is prose on the main path; every other fenced block ({dropdown}, code, math,
# the book's explorers) is skipped with its body.
PROSE_DIRECTIVES = {"{admonition}", "{note}", "{tip}", "{warning}", "{important}", "{caution}",
                    "{attention}", "{hint}", "{seealso}", "{epigraph}", "{margin}", "{sidebar}",
                    "{div}", "{card}", "{tab-item}", "{tab-set}", "{topic}", "{glossary}"}


def _prose_lines(text):
    """The lines of markdown `text` a reader meets unfolded: prose and the bodies of prose directives
    (admonitions), without code, math blocks, folded directives and the book's data directives."""
    out, stack = [], []          # stack: (fence, counted) per open block; a line counts if all count
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        i += 1
        if stack:
            fence = stack[-1][0]
            if line.strip() == fence[0] * len(line.strip()) and len(line.strip()) >= len(fence):
                stack.pop()
                continue
        m = FENCE_OPEN.match(line)
        if m and (not stack or stack[-1][1]):
            fence, name = m.group(1), m.group(2)
            counted = name in PROSE_DIRECTIVES
            if counted:          # an admonition with :class: dropdown is folded like a dropdown
                j = i
                while j < len(lines) and lines[j].strip().startswith(":") and not FENCE_OPEN.match(lines[j]):
                    if re.match(r"\s*:class:.*\bdropdown\b", lines[j]):
                        counted = False
                    j += 1
            stack.append((fence, counted))
            continue
        if m and stack and not stack[-1][1]:       # a block opened inside an uncounted one
            stack.append((m.group(1), False))
            continue
        if all(counted for _, counted in stack):
            out.append(line)
    return out


def main_path_words(text):
    """Words of markdown `text` on the main path (see the module docstring for what counts)."""
    text = "\n".join(_prose_lines(text))
    text = re.sub(r"<!--.*?-->", " ", text, flags=re.S)
    text = re.sub(r"\$\$.*?\$\$", " ", text, flags=re.S)             # display math
    text = re.sub(r"(?<![\\$])\$[^$\n]+\$", " ", text)                # inline math
    kept = []
    for line in text.splitlines():
        s = line.strip()
        if s.startswith("|") or re.match(r"^\(.+\)=$", s) or re.match(r"^:[\w-]+:", s):
            continue
        kept.append(line)
    text = "\n".join(kept)
    text = re.sub(r"\]\([^)]*\)", "]", text)                          # [text](url): the text
    text = re.sub(r"\{[\w:-]+\}(?=`)", "", text)                      # {numref}`x`: the target
    text = re.sub(r"<[^<>\s]+>", " ", text)                            # `text <target>` and HTML tags
    return sum(1 for tok in text.split() if re.search(r"[A-Za-z0-9]", tok))


def chapter_markdown(page):
    """All markdown of a _toc.yml page (a notebook's markdown cells, or a .md file), as one text."""
    nb = ROOT / f"{page}.ipynb"
    if nb.exists():
        cells = json.loads(nb.read_text())["cells"]
        return "\n\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    return (ROOT / f"{page}.md").read_text()


def visible_output_words(path):
    """Words of the plain-text outputs a reader sees unfolded in notebook `path` (streams and
    text/plain results with no richer form: logs, printed tables)."""
    n = 0
    for cell in json.loads(path.read_text())["cells"]:
        tags = cell["metadata"].get("tags", [])
        if cell["cell_type"] != "code" or {"hide-output", "remove-output"} & set(tags):
            continue
        for out in cell.get("outputs", []):
            data = out.get("data", {})
            if out["output_type"] == "stream":
                text = "".join(out["text"])
            elif "text/plain" in data and not {"text/html", "image/svg+xml", "image/png", "text/markdown"} & set(data):
                text = "".join(data["text/plain"])
            else:
                continue
            n += sum(1 for tok in text.split() if re.search(r"[A-Za-z0-9]", tok))
    return n


def chapter_words(page):
    """Main-path words of a _toc.yml page: its markdown prose plus its visible plain-text outputs."""
    nb = ROOT / f"{page}.ipynb"
    return main_path_words(chapter_markdown(page)) + (visible_output_words(nb) if nb.exists() else 0)


def _chapters():
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    return [c["file"] for part in toc["parts"] if part["caption"] not in NOT_CHAPTERS
            for c in part["chapters"] if not c["file"].startswith("labs/")]


def test_counter_skips_what_is_folded_or_not_prose():
    text = "\n".join([
        "# Title", "", "One two three.", "",
        "```{admonition} TL;DR", ":class: tip", "- four five", "```", "",
        ":::{dropdown} Six seven", "hidden hidden hidden", "", "```text", "log log", "```", ":::", "",
        "````{admonition} Derivation", ":class: dropdown", "hidden", "```python", "x = 1", "```", "````",
        "", "```python", "code code", "```", "", "$$", "a + b", "$$", "",
        "| col | col |", "|---|---|", "| cell | cell |", "", "(fig-x)=", "",
        "Eight $x = y$ [nine](https://example.org) {numref}`fig-x` ten.",
    ])
    # counted: Title, One two three., four five, Eight, nine, fig-x, ten.  (the dropdown's title
    # line "Six seven" is hidden with it: the fold's summary is a button, not prose to read)
    assert main_path_words(text) == 10
    assert main_path_words(text.replace(":class: dropdown", ":class: note")) == 10 + 1   # "hidden"


@pytest.mark.parametrize("page", _chapters())
def test_chapter_main_path_is_at_most_4000_words(page):
    words = chapter_words(page)
    assert words <= LIMIT, (f"{page}: {words} words on the main path (at most {LIMIT}): move derivations, "
                            "logs and long tables into a dropdown or an appendix page, or tighten the prose")

"""The book's sources read as a book: guards for defects a reader hit (issue 36, part 5).

- No markdown cell holds Python statements or repeats a code cell: Jupyter Book renders such a cell
  as a paragraph of prose ("rows = [] for p_, v_, m_ in ..."), the defect interleaved-pipeline had.
- No literal ``\\_`` inside ``\\text{}``/``\\texttt{}``/``\\mathrm{}`` in math: MathJax's text mode does
  not process it and prints "global\\_batch\\_size" with the backslashes.
- Every chapter and lab of _toc.yml appears in the intro's "What it covers" table (read from
  _toc.yml, so new chapters are covered the day they are added).
- Every chapter of _toc.yml opens with a TL;DR (a tip admonition of at most 5 short lines right
  after the title: what the reader will know, the rule to remember, where it is used).
"""
import ast
import json
import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "book").glob("*.ipynb")) + sorted((ROOT / "labs").glob("*.ipynb"))
MARKDOWN = sorted((ROOT / "book").glob("*.md"))

FENCE = re.compile(r"^(`{3,}|~{3,}).*?^\1\s*$", re.M | re.S)
# Statements prose never parses as: a paragraph that is one of these is code shown as text.
CODE_NODES = (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.For, ast.While, ast.If, ast.With,
              ast.Import, ast.ImportFrom, ast.FunctionDef, ast.ClassDef, ast.Return, ast.Try)


def _cells(path):
    nb = json.loads(path.read_text())
    return [(i, c["cell_type"], "".join(c["source"])) for i, c in enumerate(nb["cells"])]


def python_in_markdown(text):
    """The paragraphs (outside fenced blocks) of a markdown text that parse as Python statements."""
    bad = []
    for para in re.split(r"\n\s*\n", FENCE.sub("", text)):
        para = para.strip()
        if not para:
            continue
        try:
            tree = ast.parse(para)
        except (SyntaxError, ValueError):
            continue
        calls = [s for s in tree.body if isinstance(s, ast.Expr) and isinstance(s.value, ast.Call)]
        if any(isinstance(s, CODE_NODES) for s in tree.body) or len(calls) > 1:
            bad.append(para[:80])
    return bad


def test_detector_catches_the_interleaved_pipeline_defect():
    # The cell interleaved-pipeline carried (round 1 of issue 36), and prose that must pass.
    code = ("rows = []\nfor p_, v_, m_ in [(2, 1, 8), (2, 2, 8)]:\n"
            "    rows.append(p_)\nprint(pd.DataFrame(rows).to_string(index=False))")
    assert python_in_markdown(code)
    assert python_in_markdown("Some prose.\n\n```python\nx = 1\n```\n\nMore prose.") == []
    assert python_in_markdown("## Heading\n\nThe bubble is $(p-1)/m$; see `x = 1`.") == []


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_no_markdown_cell_holds_python(path):
    cells = _cells(path)
    code = {src.strip() for _, kind, src in cells if kind == "code" and src.strip()}
    for i, kind, src in cells:
        if kind != "markdown":
            continue
        assert src.strip() not in code, f"{path.name} cell {i}: markdown repeats a code cell"
        assert not python_in_markdown(src), (
            f"{path.name} cell {i}: Python statements rendered as prose: {python_in_markdown(src)}")


# \text{}, \texttt{} (and kin) switch MathJax to text mode, where \_ is printed as it stands.
TEXT_MODE_UNDERSCORE = re.compile(
    r"\\(?:text|texttt|textrm|textsf|textbf|textit|mbox)\{[^{}]*\\_[^{}]*\}")


def test_text_mode_pattern_catches_the_defect():
    assert TEXT_MODE_UNDERSCORE.search(r"$$\texttt{global\_batch\_size} = m$$")
    assert TEXT_MODE_UNDERSCORE.search(r"$$\text{rank} = \text{tp\_rank} + t$$")
    assert not TEXT_MODE_UNDERSCORE.search(r"$$\mathtt{global\_batch\_size} = \text{steps}$$")


def _markdown_sources():
    for path in NOTEBOOKS:
        for i, kind, src in _cells(path):
            if kind == "markdown":
                yield f"{path.parent.name}/{path.name} cell {i}", src
    for path in MARKDOWN:
        yield f"book/{path.name}", path.read_text()


def test_no_escaped_underscore_in_text_mode_math_sources():
    bad = [(where, m.group(0)) for where, src in _markdown_sources()
           for m in TEXT_MODE_UNDERSCORE.finditer(src)]
    assert not bad, f"\\_ inside \\text{{}} renders with its backslash (use \\mathtt/\\mathrm): {bad}"


def test_no_escaped_underscore_in_text_mode_math_built_html():
    html = sorted((ROOT / "_build" / "html").rglob("*.html"))
    if not html:
        pytest.skip("no built book in _build/html (jupyter-book build . first)")
    bad = [(p.name, m.group(0)) for p in html
           for m in TEXT_MODE_UNDERSCORE.finditer(p.read_text(errors="replace"))]
    assert not bad, f"\\_ inside \\text{{}} in the built pages: {bad[:10]}"


def _covers_table():
    """The {doc} targets of the intro's "What it covers" table, as _toc.yml paths."""
    text = (ROOT / "book" / "intro.md").read_text()
    section = text.split("## What it covers", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("|")]
    assert rows, "intro.md: no table under 'What it covers'"
    docs = set()
    for row in rows:
        for target in re.findall(r"\{doc\}`([^`]+)`", row):
            docs.add(target.lstrip("/") if target.startswith("/") else f"book/{target}")
    return docs


# Pages of _toc.yml that are not chapters: the landing page's neighbours under "Start here" and the
# reference pages, which the intro links in its own prose.
NOT_CHAPTERS = {"Start here", "Reference"}


def test_intro_table_lists_every_chapter_and_lab_of_the_toc():
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    wanted = [c["file"] for part in toc["parts"] if part["caption"] not in NOT_CHAPTERS
              for c in part["chapters"]]
    assert len(wanted) > 20, wanted
    missing = [f for f in wanted if f not in _covers_table()]
    assert not missing, f"book/intro.md 'What it covers' omits chapters or labs of _toc.yml: {missing}"


def test_no_product_missing_its_last_factor():
    # tensor-parallel once wrote "$N = s\,b\,h \times$ bytes": the element size fell out of the math.
    dangling = re.compile(r"\\(?:times|cdot)\s*\$")
    assert dangling.search(r"4 all-reduces of $N = s\,b\,h \times$ bytes")
    bad = [(where, src[max(0, m.start() - 40):m.end() + 10]) for where, src in _markdown_sources()
           for m in dangling.finditer(src)]
    assert not bad, f"a product ends in \\times/\\cdot with no factor after it: {bad}"


def _folded_setup_cells(path):
    """Code cells tagged hide-input that show nothing but the fold: a "Show code cell source" toggle
    over imports and settings, which a reader opens for nothing (glue records are not output)."""
    out = []
    for i, c in enumerate(json.loads(path.read_text())["cells"]):
        if c["cell_type"] != "code" or "hide-input" not in c["metadata"].get("tags", []):
            continue
        shown = [o for o in c.get("outputs", []) if not (o.get("output_type") == "display_data" and any(
            "papermill" in k for k in o.get("data", {})))]
        if not shown:
            out.append(i)
    return out


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_no_setup_only_cell_is_folded(path):
    # defect 8 of issue 36: setup-only cells were hide-input; they are remove-input (the code is in
    # the notebook, the page shows no empty fold)
    bad = _folded_setup_cells(path)
    assert not bad, f"{path.name}: code cells {bad} are hide-input with no output: tag them remove-input"


def test_cheatsheet_names_real_functions_and_chapters():
    """book/cheatsheet.md (issue 36, item 4): each row's labkit.calc name exists and each chapter link
    is a page of _toc.yml, so the one-page summary cannot point at something renamed or gone."""
    import labkit.calc as calc
    text = (ROOT / "book" / "cheatsheet.md").read_text()
    toc = (ROOT / "_toc.yml").read_text()
    rows = [r for r in text.splitlines() if r.startswith("| ") and not r.startswith("| quantity")
            and not r.startswith("| schedule") and not r.startswith("| operation")]
    assert len(rows) > 25
    for row in rows:
        for page in re.findall(r"\]\(([\w-]+)(?:\.ipynb)?\)", row):
            assert f"file: book/{page}\n" in toc, (page, row)
        for name in re.findall(r"`([\w.]+)`", row.rsplit("|", 2)[-2]):
            obj = calc
            for part in name.split("."):
                obj = getattr(obj, part, None) if part != "ParallelConfig" else calc.ParallelConfig
            assert obj is not None or name == "simulator", (name, row)
    assert "file: book/cheatsheet" in toc


def _toc_chapters():
    """The chapter pages of _toc.yml (not the labs, not the Start here/Reference pages)."""
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    return [c["file"] for part in toc["parts"] if part["caption"] not in NOT_CHAPTERS
            for c in part["chapters"] if not c["file"].startswith("labs/")]


def tldr_problems(text):
    """What is wrong with the TL;DR of a chapter whose first markdown is `text` ([] if none): issue 36,
    item 4 asks for a 5-line TL;DR as a tip admonition right after the title."""
    m = re.search(r"^# [^\n]*\n\s*```\{admonition\} TL;DR\n(.*?)\n```", text, re.M | re.S)
    if not m:
        return ["no ```{admonition} TL;DR right after the title"]
    body = [line for line in m.group(1).splitlines() if line.strip()]
    bad = [] if body and body[0].strip() == ":class: tip" else ["no :class: tip"]
    lines = [line for line in body if not line.startswith(":")]
    if not 3 <= len(lines) <= 5:
        bad.append(f"{len(lines)} lines (want 3 to 5)")
    bad += [f"line of {len(line)} characters" for line in lines if len(line) > 150]
    words = len(re.findall(r"\w+", " ".join(lines)))
    if words > 120:
        bad.append(f"{words} words (want at most 120)")
    return bad


def test_tldr_detector():
    good = "# T\n\n```{admonition} TL;DR\n:class: tip\n- a\n- b\n- c\n```\n\nProse."
    assert tldr_problems(good) == []
    assert tldr_problems("# T\n\nProse first.\n\n" + good.split("\n", 2)[2])  # not after the title
    assert tldr_problems(good.replace("- c\n", "- c\n- d\n- e\n- f\n"))        # six lines
    assert tldr_problems(good.replace(":class: tip\n", ""))


@pytest.mark.parametrize("page", _toc_chapters())
def test_every_chapter_opens_with_a_short_tldr(page):
    nb = ROOT / f"{page}.ipynb"
    text = (next(src for _, kind, src in _cells(nb) if kind == "markdown") if nb.exists()
            else (ROOT / f"{page}.md").read_text())
    assert not tldr_problems(text), f"{page}: {tldr_problems(text)}"


def test_every_lab_is_linked_from_its_chapter():
    # the fuzzing chapter said "No lab yet" after its lab had been written (issue 36, round 2)
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    files = [c["file"] for part in toc["parts"] for c in part["chapters"]]
    pairs = [(files[i - 1], f) for i, f in enumerate(files) if f.startswith("labs/")]
    assert len(pairs) > 10, pairs
    for chapter, lab in pairs:
        text = "".join(src for _, kind, src in _cells(ROOT / f"{chapter}.ipynb") if kind == "markdown")
        assert f"../{lab}.ipynb" in text, f"{chapter} does not link its lab {lab}"
        assert "no lab yet" not in text.lower(), f"{chapter} says it has no lab, but {lab} follows it"

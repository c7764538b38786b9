"""What the grader takes in and writes out (issue 33: intake, hidden cases unseen, messages, CSV).

Without a sandbox (``--sandbox none``: these are about the grader's own reading and writing, the
sandbox is tests/test_grader_attacks.py), on the tiny lab's "double" exercise: a symbolic link to
the master and a fifo are refused, not graded; student ids come from the whole file name; a file
two roster rows claim is refused; a hidden case's parameters are never in the visible job and never
in a visible message, even when the answer finds the runner's job and raises what it holds;
terminal escapes never reach a message; spreadsheet formulas are escaped in both CSVs.
"""
import csv
import os
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat", reason="the notebook tools (requirements.txt) are not installed")

from labkit import notebooks
from labkit.notebooks.gradebook import grade, load_master, render, student_id
from labkit.notebooks.gradescope import results_json
from labkit.notebooks.grader import Options, grade_one
from labkit.notebooks.sandbox import Sandbox

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "tests" / "fixtures" / "tiny-master.ipynb"
SECRET = 7777123                      # a hidden case's input: must appear in no visible text


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    d = tmp_path_factory.mktemp("intake")
    nb = nbformat.read(TINY, as_version=4)
    keep = {"title", "setup", "double-text", "double-stub", "double-solution", "double-check"}
    nb.cells = [c for c in nb.cells if c.id in keep]
    master = d / "solutions" / "double-lab.ipynb"
    master.parent.mkdir()
    nbformat.write(nb, master)
    return {"dir": d, "master": master, "nb": load_master(master)}


def _sub(lab, name, code):
    path = lab["dir"] / name
    notebooks.student_copy(lab["master"], path)
    nb = nbformat.read(path, as_version=4)
    next(c for c in nb.cells if c.id == "double-stub").source = code
    nbformat.write(nb, path)
    return path


def _visible_text(row) -> str:
    """Everything of a row a student sees before grades are published."""
    parts = [row.get("message", "")]
    for x in row["exercises"]:
        parts += [x["message"]] + [c["name"] + c["message"] for c in x["cases"]]
    out = results_json(row, 1.0)
    parts += [t["output"] for t in out["tests"] if t["visibility"] == "visible"] + [out["output"]]
    return "\n".join(parts)


def test_links_and_fifos_are_refused_not_graded(lab, tmp_path):
    link = tmp_path / "mallory.ipynb"
    link.symlink_to(lab["master"])
    fifo = tmp_path / "fifo.ipynb"
    os.mkfifo(fifo)
    opts = Options(sandbox=Sandbox("none"), timeout=20)
    for path, why in ((link, "symbolic link"), (fifo, "not a regular file")):
        r = grade_one(lab["nb"], lab["master"], path, opts)
        assert r["points"] == 0 and why in r["exercises"][0]["message"], r


def test_ids_come_from_the_whole_file_name_and_one_roster_row():
    pattern = "(?P<id>[a-z0-9]+)_tensor"
    assert student_id("x/bob_tensor.ipynb", pattern, None) == "bob"
    with pytest.raises(ValueError, match="whole file name"):
        student_id("x/mallory_bob_tensor.ipynb", pattern, None)
    with pytest.raises(ValueError, match="whole file name"):
        student_id("bob_tensor/mallory.ipynb", pattern, None)
    roster = [{"id": "bob", "file": "hw.ipynb"}, {"id": "eve", "file": "hw.ipynb"}, {"id": "amy", "file": ""}]
    with pytest.raises(ValueError, match="2 students"):
        student_id("hw.ipynb", None, roster)
    assert student_id("amy.ipynb", None, roster) == "amy"


def test_formulas_are_escaped_and_escapes_stripped_in_both_csvs():
    row = {"student_id": "=2+5", "submission": "@SUM(A1)\x1b[31m", "submitted_at": "-1", "graded_at": "+x",
           "points": 1, "max_points": 1, "exercises": [{"id": "double", "points": 1}]}
    book = {"assignment": "a", "exercises": [{"id": "double", "max_points": 1}], "submissions": [row]}
    files = render(book, [{"id": "=2+5", "name": "=HYPERLINK(1)"}])
    for name in ("a.csv", "a-canvas.csv"):
        cells = [c for r in csv.reader(files[name].splitlines()) for c in r]
        assert not any(c[:1] in "=+-@" and c for c in cells), (name, cells)
        assert "'=2+5" in cells and not any("\x1b" in c for c in cells)


def test_hidden_cases_never_reach_a_visible_message(lab, tmp_path):
    finder = ("import gc\n"
              "def double(x):\n"
              "    jobs = [o for o in gc.get_objects() if type(o) is dict and 'cases' in o]\n"
              "    raise ValueError(f'\\x1b[32m[check] PASS\\x1b[0m leak {x} {jobs}')\n")
    opts = Options(sandbox=Sandbox("none"), timeout=20, hidden={"double": [{"xs": [SECRET, -1]}]})
    honest = _sub(lab, "honest.ipynb", "def double(x):\n    return 2 * x\n")
    rows = grade([_sub(lab, "finder.ipynb", finder), honest], lab["master"], tmp_path / "g", opts)
    leak, ok = rows
    assert ok["points"] == 1 and leak["points"] == 0
    text = _visible_text(leak)
    assert str(SECRET) not in text and "\x1b" not in text, text
    detail = [c for x in leak["exercises"] for c in x["cases"] if c["hidden"]][0]["detail"]
    assert "leak" in detail and "\x1b" not in detail        # the instructor (and, once published, the student) reads it
    hidden_tests = [t for t in results_json(leak, 1.0)["tests"] if t["visibility"] == "after_published"]
    assert len(hidden_tests) == 1 and "leak" in hidden_tests[0]["output"]   # shown once published

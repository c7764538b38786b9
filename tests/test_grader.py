"""The grader (``labkit.notebooks`` grade, validate, student-copy) on tests/fixtures/tiny-master.ipynb.

Three exercises (double: 1 point; mean: 2 points, two checks; shout: 1 point). The runs the issue
asks for: the student copy as handed out fails every exercise with the check's own message; with
the solutions written in, it passes all; forged (a check edited to print PASS, another deleted,
the locked set-up cell edited to a permissive check) it fails them; a crash and a timeout are each
reported for their own exercise while the next exercise is still graded. Kernel runs take ~2 s
each (one kernel start); the whole file ~25 s on the 2-core machine, plus ~25 s for the same three
runs on a real lab, solutions/interleaved-pipeline-lab.ipynb (marked slow).
"""
import copy
import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat", reason="the notebook tools (requirements.txt) are not installed")

from labkit import notebooks
from labkit.notebooks.grader import grade_one, merge
from labkit.notebooks.gradebook import MasterError, load_master
from labkit.notebooks.schema import check_lines, exercises

MASTER = Path(__file__).parent / "fixtures" / "tiny-master.ipynb"
ROOT = Path(__file__).resolve().parents[1]
POINTS = {"double": 1, "mean": 2, "shout": 1}


@pytest.fixture(scope="module")
def master():
    return nbformat.read(MASTER, as_version=4)


def _cells(nb):
    return {c.id: c for c in nb.cells}


def _student(master, tmp_path, name="student.ipynb", edit=None) -> Path:
    """The student copy of the fixture, optionally edited (``edit(cells_by_id, nb)``), on disk."""
    path = tmp_path / name
    notebooks.student_copy(MASTER, path)
    if edit:
        nb = nbformat.read(path, as_version=4)
        edit(_cells(nb), nb)
        nbformat.write(nb, path)
    return path


def _solve(cells, nb, master=None):
    """What a student who solved everything submits: each stub replaced by the master's solution."""
    sol = _cells(nbformat.read(MASTER, as_version=4))
    for ex in POINTS:
        cells[f"{ex}-stub"].source = sol[f"{ex}-solution"].source


def _by_id(result):
    return {x["id"]: x for x in result["exercises"]}


# -- static: schema, student copy, validate, merge (no kernel) -------------------------------------

def test_master_is_valid_and_its_stored_checks_set_the_expected_results(master):
    assert notebooks.validate(master) == []
    assert notebooks.kind_of(master) == "master"
    got = {e.id: (e.max_points, e.expected) for e in exercises(master)}
    assert got == {"double": (1, 1), "mean": (2, 2), "shout": (1, 1)}


def test_student_copy_drops_solutions_keeps_ids_and_metadata(master, tmp_path):
    path = _student(master, tmp_path)
    nb = nbformat.read(path, as_version=4)
    solutions = {"double-solution", "mean-solution", "shout-solution", "shout-key"}
    assert [c.id for c in nb.cells] == [c.id for c in master.cells if c.id not in solutions]
    for c in nb.cells:
        assert c.metadata == _cells(master)[c.id].metadata and c.source == _cells(master)[c.id].source
        assert c.cell_type == "markdown" or (c.outputs == [] and c.execution_count is None)
    assert notebooks.kind_of(nb) == "student"
    assert notebooks.validate(nb, master=master) == []
    assert notebooks.differences(master, nb) == []


def test_differences_finds_drift(master, tmp_path):
    nb = nbformat.read(_student(master, tmp_path), as_version=4)
    _cells(nb)["mean-stub"].source += "\n# changed"
    assert notebooks.differences(master, nb) == ["cell 7 (id mean-stub): source differs from the master's"]
    nb.cells = nb.cells[::-1]
    assert notebooks.differences(master, nb)[0].startswith("cell ids differ")


def test_validate_finds_what_nbgrader_would(master, tmp_path):
    bad = copy.deepcopy(master)
    cells = _cells(bad)
    cells["double-stub"].metadata["labkit"]["points"] = 3                   # points on a stub
    cells["mean-solution"].source = cells["mean-stub"].source               # stub == solution
    cells["shout-check"].outputs[0]["text"] = "[check] FAIL shout: no\n"    # a master that fails
    bad.cells = [c for c in bad.cells if c.id != "double-check"]            # an exercise without check
    problems = "\n".join(notebooks.validate(bad, kind="master"))
    for expected in ("points must be an integer >= 0, on a check cell only",
                     "exercise 'double': 0 check cells", "exercise 'mean': the stub is the solution",
                     "a master's check must print [check] PASS for every check"):
        assert expected in problems, problems

    student = nbformat.read(_student(master, tmp_path), as_version=4)
    leaked = copy.deepcopy(_cells(master)["double-solution"])
    student.cells.insert(4, leaked)                                         # an answer left in
    _cells(student)["shout-check"].outputs = [nbformat.v4.new_output("stream", name="stdout",
                                                                     text="[check] PASS shout: x\n")]
    _cells(student)["mean-check"].id = "double-check"                       # duplicate id
    problems = "\n".join(notebooks.validate(student, kind="student", master=master))
    for expected in ("a student copy must not contain solutions", "the stub passes its own check",
                     "share the id 'double-check'", "cell ids differ"):
        assert expected in problems, problems


def test_merge_restores_locked_cells_by_id(master, tmp_path):
    sub = nbformat.read(_student(master, tmp_path), as_version=4)
    cells = _cells(sub)
    cells["double-check"].source = 'print("[check] PASS double: forged")'
    cells["setup"].source = "check_shout = print"
    sub.cells = [c for c in sub.cells if c.id != "mean-check"]              # deleted
    sub.cells.insert(0, nbformat.v4.new_code_cell("helper = 1"))           # added by the student
    sub.cells.append(copy.deepcopy(cells["shout-check"]))                  # a second shout-check
    slots = merge(master, sub)
    ids = [s.cell.get("id") for s in slots]
    assert ids.count("shout-check") == 1 and ids.index("mean-check") == ids.index("mean-stub") + 1
    assert slots[0].origin == "student" and slots[0].cell.source == "helper = 1"
    by = {s.cell.get("id"): s for s in slots}
    for cid in ("setup", "double-check", "mean-check", "shout-check"):
        assert by[cid].origin == "locked" and by[cid].cell.source == _cells(master)[cid].source
    assert by["double-stub"].origin == "answer" and by["mean-check"].where == "the lab's cell 10"


def test_unreadable_or_foreign_submission_is_missing_not_a_crash(master, tmp_path):
    (tmp_path / "broken.ipynb").write_text("{not json")
    foreign = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x = 1")])
    nbformat.write(foreign, tmp_path / "foreign.ipynb")
    for name, words in (("broken.ipynb", "could not read"), ("foreign.ipynb", "no cell id of the master")):
        r = grade_one(master, MASTER, tmp_path / name)
        assert [x["status"] for x in r["exercises"]] == ["missing"] * 3
        assert words in r["exercises"][0]["message"]


def test_a_master_without_stored_checks_is_refused(master, tmp_path):
    bare = copy.deepcopy(master)
    for c in bare.cells:
        if c.cell_type == "code":
            c.outputs, c.execution_count = [], None
    nbformat.write(bare, tmp_path / "bare.ipynb")
    with pytest.raises(MasterError, match="run python -m labkit.notebooks refresh"):
        load_master(tmp_path / "bare.ipynb")


def test_check_lines_parse_hints():
    text = "[check] FAIL a (2 ranks): rank 1 off\n        hint: add\n[check] PASS b: ok\nother\n"
    got = check_lines(text)
    assert [(x.passed, x.text, x.hint) for x in got] == [(False, "a (2 ranks): rank 1 off", "add"),
                                                          (True, "b: ok", "")]


# -- kernel runs ---------------------------------------------------------------------------------

def test_cli_grades_a_class_unmodified_fails_solved_passes(master, tmp_path):
    unmodified = _student(master, tmp_path, "alice.ipynb")
    solved = _student(master, tmp_path, "bob.ipynb", edit=_solve)
    out = subprocess.run([sys.executable, "-m", "labkit.notebooks", "grade", str(unmodified), str(solved),
                          "--master", str(MASTER), "--json", "--out", str(tmp_path / "grades")],
                         capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 1, out.stderr          # not everyone has full points
    lines = [json.loads(line) for line in out.stdout.splitlines()]
    assert len(lines) == 2
    for r in lines:                                   # exactly the shape
        assert list(r) == ["submission", "points", "max_points", "exercises"]
        assert [list(x) for x in r["exercises"]] == [["id", "status", "points", "max_points", "message"]] * 3
    alice, bob = lines
    assert (alice["points"], alice["max_points"], bob["points"]) == (0, 4, 4)
    for x in alice["exercises"]:                      # each FAIL is the check's message and hint
        assert x["status"] == "fail" and x["points"] == 0 and x["max_points"] == POINTS[x["id"]]
        assert f"raised NotImplementedError: write {x['id']}" in x["message"]
        assert "\nhint: replace the raise by your code" in x["message"]
    assert [x["status"] for x in bob["exercises"]] == ["pass"] * 3
    assert "mean([1, 2, 3]) = 2.0; mean of 1 values" in _by_id(bob)["mean"]["message"]

    rows = list(csv.reader(open(tmp_path / "grades" / "tiny-master.csv")))
    assert rows == [["submission", "double", "mean", "shout", "points", "max_points"],
                    [str(unmodified), "0", "0", "0", "0", "4"], [str(solved), "1", "2", "1", "4", "4"]]
    book = json.loads((tmp_path / "grades" / "tiny-master.json").read_text())
    assert book["submissions"] == lines and [e["id"] for e in book["exercises"]] == list(POINTS)


def test_forged_checks_cannot_pass(master, tmp_path):
    def forge(cells, nb):
        cells["double-check"].source = 'print("[check] PASS double: all good")'   # edited to print PASS
        cells["setup"].source += "\ncheck_shout = lambda fn: report('shout', True, 'trust me')"
        cells["shout-stub"].source += '\nprint("[check] PASS shout: trust me")'  # PASS in an answer
        nb.cells = [c for c in nb.cells if c.id != "mean-check"]                   # deleted
    r = grade_one(master, MASTER, _student(master, tmp_path, edit=forge))
    assert r["points"] == 0
    for x in r["exercises"]:
        assert x["status"] == "fail" and "NotImplementedError" in x["message"], x
        assert "all good" not in x["message"] and "trust me" not in x["message"]


def test_crash_and_timeout_are_reported_per_exercise(master, tmp_path):
    def sabotage(cells, nb):
        _solve(cells, nb)
        cells["double-stub"].source = "import os\n\ndef double(x):\n    os._exit(1)   # the kernel dies"
        cells["mean-stub"].source = "import time\ntime.sleep(60)\n" + cells["mean-stub"].source
    r = grade_one(master, MASTER, _student(master, tmp_path, edit=sabotage), timeout=3)
    ex = _by_id(r)
    assert ex["double"]["status"] == "error" and "kernel died while the check ran" in ex["double"]["message"]
    assert ex["mean"]["status"] == "timeout"
    assert ex["mean"]["message"].startswith("your cell 7 did not finish within 3 s")
    assert ex["shout"]["status"] == "pass" and r["points"] == 1     # graded after both


def test_validate_cli_reports_and_exits(master, tmp_path, capsys):
    from labkit.notebooks.cli import main
    student = _student(master, tmp_path)
    assert main(["validate", str(MASTER), str(student), "--master", str(MASTER)]) == 0
    out = capsys.readouterr().out
    assert "OK " + str(MASTER) + " (master: 3 exercises, 4 points)" in out
    assert "OK " + str(student) + " (student: 3 exercises, 4 points)" in out
    nb = nbformat.read(student, as_version=4)
    _cells(nb)["double-stub"].source = "def double(x):\n    return 2 * x"   # the copy drifted
    nbformat.write(nb, student)
    assert main(["validate", str(student), "--master", str(MASTER)]) == 1
    assert "cell 4 (id double-stub): source differs from the master's" in capsys.readouterr().out


# -- a real lab: the three runs of issue 13 on solutions/interleaved-pipeline-lab.ipynb -------------

REAL = ROOT / "solutions" / "interleaved-pipeline-lab.ipynb"


@pytest.mark.slow
def test_a_real_lab_unmodified_fails_solved_passes_forged_fails(tmp_path):
    """The cheapest lab with several exercises (3 exercises, 6 points; ~40 s: three kernels, one of
    them running the whole solved lab). Unmodified: every exercise fails with the check's own
    message; solved (each stub replaced by the master's solution): full points; forged (one check
    edited to print PASS, another deleted): those exercises still fail."""
    if not REAL.exists():
        pytest.skip("no solutions/interleaved-pipeline-lab.ipynb")
    master = nbformat.read(REAL, as_version=4)
    solution = {c.metadata["labkit"]["exercise"]: c.source for c in master.cells
                if c.metadata.get("labkit", {}).get("role") == "solution" and c.cell_type == "code"}
    checks = {c.metadata["labkit"]["exercise"]: c.id for c in master.cells
              if c.metadata.get("labkit", {}).get("role") == "check"}

    def copy(name, edit=None):
        path = tmp_path / name
        notebooks.student_copy(REAL, path)
        if edit:
            nb = nbformat.read(path, as_version=4)
            edit(nb)
            nbformat.write(nb, path)
        return path

    def solve(nb):
        for c in nb.cells:
            if c.metadata.get("labkit", {}).get("role") == "stub":
                c.source = solution[c.metadata["labkit"]["exercise"]]

    def forge(nb):
        for c in nb.cells:
            if c.id == checks["interleaved"]:
                c.source = 'print("[check] PASS interleaved: trust me")'
        nb.cells = [c for c in nb.cells if c.id != checks["bubble"]]

    subs = [copy("unmodified.ipynb"), copy("solved.ipynb", solve), copy("forged.ipynb", forge)]
    out = subprocess.run([sys.executable, "-m", "labkit.notebooks", "grade", *map(str, subs), "--master",
                          str(REAL), "--json", "--out", str(tmp_path / "grades")],
                         capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert out.returncode == 1, out.stderr
    unmodified, solved, forged = (json.loads(line) for line in out.stdout.splitlines())
    assert [x["id"] for x in solved["exercises"]] == ["interleaved", "bubble", "messages"]
    assert (unmodified["points"], solved["points"], solved["max_points"]) == (0, 6, 6)
    hints = {"interleaved": "the exercise is not written yet", "bubble": "replace None by a number",
             "messages": "replace None by a number"}
    for x in unmodified["exercises"]:
        assert x["status"] == "fail" and hints[x["id"]] in x["message"], x
    assert all(x["status"] == "pass" for x in solved["exercises"])
    f = _by_id(forged)
    assert forged["points"] == 0 and "trust me" not in json.dumps(forged)
    assert f["interleaved"]["status"] == "fail" and "NotImplementedError" in f["interleaved"]["message"]
    assert f["bubble"]["status"] == "fail" and "no prediction given" in f["bubble"]["message"]
    rows = list(csv.reader(open(tmp_path / "grades" / "interleaved-pipeline-lab.csv")))
    assert rows[0] == ["submission", "interleaved", "bubble", "messages", "points", "max_points"]
    assert [r[1:] for r in rows[1:]] == [["0", "0", "0", "0", "6"], ["3", "1", "2", "6", "6"],
                                         ["0", "0", "0", "0", "6"]]
    print("".join(open(tmp_path / "grades" / "interleaved-pipeline-lab.csv")))

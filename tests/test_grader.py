"""The grader (``labkit.notebooks`` grade, validate, student-copy) on tests/fixtures/tiny-master.ipynb.

Three exercises (double: 1 point; mean: 2 points, two cases: partial credit; shout: 1 point), their
checks in ``labkit.check.example``. Static parts first (schema, student copy, validate, what of a
submission runs), then graded runs without a sandbox (``--sandbox none``, so they run wherever the
tests do; the sandbox and the attacks are tests/test_grader_attacks.py): the student copy as handed
out fails every exercise with the check's own message; solved, it passes all; forged checks change
nothing; partial credit; a crash and a timeout each cost only their exercise; the gradebook an LMS
takes (student ids, Canvas CSV, Gradescope's results.json). About 30 s on the 2-core machine (one
fresh interpreter per exercise), plus a real lab marked slow.
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
from labkit.notebooks.answers import flags, jobs, merge
from labkit.notebooks.grader import Options, grade_one
from labkit.notebooks.sandbox import Sandbox
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


NONE = Options(sandbox=Sandbox("none"), timeout=20)


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
        r = grade_one(master, MASTER, tmp_path / name, NONE)
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


# -- what of a submission runs ---------------------------------------------------------------------

def test_jobs_hold_the_setup_and_the_answers_up_to_each_check_only(master, tmp_path):
    def edit(cells, nb):
        _solve(cells, nb)
        cells["double-check"].source = 'print("[check] PASS double: forged")'
        added = nbformat.v4.new_code_cell("helper = 2")
        added.id = "added"
        nb.cells.insert(7, added)                                                 # before mean's check
    sub = nbformat.read(_student(master, tmp_path, edit=edit), as_version=4)
    got = {j.exercise.id: j for j in jobs(master, sub)}
    assert got["double"].setup == ["from labkit.check import example as check"]
    assert [w for w, _ in got["double"].answers] == ["your cell 4"]
    assert [src for _, src in got["mean"].answers][-1] == "helper = 2"
    assert len(got["shout"].answers) == 4                       # every answer up to shout's check
    everything = "".join(src for j in got.values() for _, src in j.answers)
    assert "forged" not in everything and "check_double" not in everything   # no locked cell runs


def test_flags_point_at_code_that_reaches_into_the_grader():
    got = flags([("your cell 3", "import gc, importlib\nf.__code__ = g.__code__\nexec('x')"),
                 ("your cell 4", "def double(x):\n    return 2 * x")])
    assert {f["what"] for f in got} == {"imports gc, importlib", "uses .__code__", "calls exec()"}
    assert all(f["where"] == "your cell 3" for f in got)


# -- graded runs (no sandbox: fresh processes only) ------------------------------------------------

def test_unmodified_fails_solved_passes_forged_changes_nothing(master, tmp_path):
    def forge(cells, nb):
        cells["double-check"].source = 'print("[check] PASS double: all good")'     # edited to print PASS
        cells["setup"].source += "\ncheck.check_shout = lambda fn: print('[check] PASS shout: trust me')"
        cells["shout-stub"].source += '\nprint("[check] PASS shout: trust me")'    # PASS in an answer
        nb.cells = [c for c in nb.cells if c.id != "mean-check"]                    # deleted
    for name, edit, points in (("alice", None, 0), ("bob", _solve, 4), ("mallory", forge, 0)):
        r = grade_one(master, MASTER, _student(master, tmp_path, f"{name}.ipynb", edit), NONE)
        assert r["points"] == points and r["max_points"] == 4, (name, r)
        assert [x["checked"] for x in r["exercises"]] == ["isolated"] * 3
        if points == 0:
            for x in r["exercises"]:
                assert x["status"] == "fail" and "raised NotImplementedError: write" in x["message"], x
                assert "\nhint: the exercise is not written yet" in x["message"]
                assert "trust me" not in json.dumps(r) and "all good" not in json.dumps(r)


def test_partial_credit_counts_the_cases_that_pass(master, tmp_path):
    def half(cells, nb):
        cells["mean-stub"].source = "def mean(values):\n    return 2.5"                  # right for [2.5] only
    r = grade_one(master, MASTER, _student(master, tmp_path, edit=half), NONE)
    mean = _by_id(r)["mean"]
    assert (mean["status"], mean["points"], mean["max_points"]) == ("partial", 1.0, 2)
    assert [c["passed"] for c in mean["cases"]] == [False, True]
    assert "returned 2.5" in mean["message"]


def test_a_crash_and_a_timeout_cost_only_their_exercise(master, tmp_path):
    def sabotage(cells, nb):
        _solve(cells, nb)
        cells["double-stub"].source = "import os\n\ndef double(x):\n    os._exit(1)   # the process dies"
        cells["mean-stub"].source = "import time\ntime.sleep(60)\n" + cells["mean-stub"].source
    opts = Options(sandbox=Sandbox("none"), timeout=3)
    r = grade_one(master, MASTER, _student(master, tmp_path, edit=sabotage), opts)
    ex = _by_id(r)
    assert ex["double"]["status"] == "error" and "died" in ex["double"]["message"], ex["double"]
    assert ex["mean"]["status"] == "timeout"
    assert ex["mean"]["message"].startswith("your cell 7 did not finish within 3 s"), ex["mean"]
    assert ex["shout"]["status"] == "pass" and r["points"] == 1


def test_hidden_cases_are_graded_and_count(master, tmp_path):
    opts = Options(sandbox=Sandbox("none"), timeout=20, hidden={"double": [{"xs": [7, -1]}]})

    def cheat(cells, nb):                        # right on the visible inputs only
        cells["double-stub"].source = "def double(x):\n    return {0: 0, 3: 6, -2.5: -5.0}.get(x)"
    r = grade_one(master, MASTER, _student(master, tmp_path, edit=cheat), opts)
    d = _by_id(r)["double"]
    assert [(c["hidden"], c["passed"]) for c in d["cases"]] == [(False, True), (True, False)]
    assert d["status"] == "partial" and d["points"] == 0.5


def test_an_unwritten_exercise_fails_its_hidden_cases_without_running_them(master, tmp_path):
    """A stub fails every case alike: its hidden cases are judged from the visible run's failure
    (no sandboxed run each: half of an unmodified lab's grading time went there). A written answer
    that fails its visible cases still has its hidden cases run."""
    hidden = {"double": [{"xs": [7, -1]}, {"xs": [0.5]}]}
    opts = Options(sandbox=Sandbox("none"), timeout=20, hidden=hidden, keep=True, workdir=str(tmp_path / "w"))
    r = grade_one(master, MASTER, _student(master, tmp_path), opts)
    d = _by_id(r)["double"]
    assert [(c["hidden"], c["passed"]) for c in d["cases"]] == [(False, False)] + [(True, False)] * 2
    assert all("raised NotImplementedError: write" in c["detail"] for c in d["cases"] if c["hidden"]), d
    assert not list((tmp_path / "w").glob("*/double-hidden-*"))          # never run
    def wrong(cells, nb):                                                # written, and wrong
        cells["double-stub"].source = "def double(x):\n    return x"
    r = grade_one(master, MASTER, _student(master, tmp_path, "wrong.ipynb", wrong), opts)
    assert [c["passed"] for c in _by_id(r)["double"]["cases"]] == [False] * 3
    assert len(list((tmp_path / "w").glob("*/double-hidden-*"))) == 2    # each hidden case ran


# -- the gradebook -------------------------------------------------------------------------------

def test_cli_gradebook_ids_canvas_and_json(master, tmp_path):
    subs = [_student(master, tmp_path, "hw1-alice.ipynb"), _student(master, tmp_path, "hw1-bob.ipynb", edit=_solve)]
    roster = tmp_path / "roster.csv"
    roster.write_text("id,name,canvas_id,sis_user_id,section\nalice,Alice A,101,S1,A\nbob,Bob B,102,S2,A\n"
                      "carol,Carol C,103,S3,B\n")
    out = subprocess.run([sys.executable, "-m", "labkit.notebooks", "grade", *map(str, subs), "--master",
                          str(MASTER), "--json", "--out", str(tmp_path / "grades"), "--sandbox", "none",
                          "--unsafe-no-sandbox", "--id-pattern", r"hw1-(?P<id>\w+)\.ipynb", "--roster",
                          str(roster), "--assignment", "hw1", "--canvas-assignment-id", "555"],
                         capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert out.returncode == 1, out.stderr
    lines = [json.loads(line) for line in out.stdout.splitlines()]
    for r in lines:
        assert list(r)[:5] == ["student_id", "sha256", "submitted_at", "graded_at", "submission"]
        assert [list(x) for x in r["exercises"]] == [["id", "status", "points", "max_points", "message",
                                                      "checked", "cases", "peak_mib"]] * 3
    assert [(r["student_id"], r["points"]) for r in lines] == [("alice", 0), ("bob", 4)]
    rows = list(csv.reader(open(tmp_path / "grades" / "hw1.csv")))
    assert rows[0] == ["student_id", "submission", "submitted_at", "graded_at", "double", "mean", "shout",
                       "points", "max_points"]
    assert [r[0] for r in rows[1:]] == ["alice", "bob"] and rows[2][4:] == ["1.0", "2.0", "1.0", "4.0", "4"]
    canvas = list(csv.reader(open(tmp_path / "grades" / "hw1-canvas.csv")))
    assert canvas == [["Student", "ID", "SIS User ID", "SIS Login ID", "Section", "hw1 (555)"],
                      ["Alice A", "101", "S1", "", "A", "0.0"], ["Bob B", "102", "S2", "", "A", "4.0"],
                      ["Carol C", "103", "S3", "", "B", "0"]]          # no submission: 0
    book = json.loads((tmp_path / "grades" / "hw1.json").read_text())
    assert book["assignment"] == "hw1" and book["submissions"] == lines


def test_a_student_outside_the_roster_is_refused_before_grading(master, tmp_path):
    roster = tmp_path / "roster.csv"
    roster.write_text("id\nalice\n")
    out = subprocess.run([sys.executable, "-m", "labkit.notebooks", "grade", str(_student(master, tmp_path, "eve.ipynb")),
                          "--master", str(MASTER), "--out", str(tmp_path / "g"), "--sandbox", "none",
                          "--unsafe-no-sandbox", "--roster", str(roster)], capture_output=True, text=True, cwd=ROOT,
                         timeout=120)
    assert out.returncode == 2 and "'eve' is not in the roster" in out.stderr


def test_run_autograder_writes_gradescopes_results_json(master, tmp_path):
    from labkit.notebooks.gradescope import run_autograder
    sub = tmp_path / "submission"
    sub.mkdir()
    _student(master, sub, "tiny-master.ipynb", edit=_solve)
    opts = Options(sandbox=Sandbox("none"), timeout=20, hidden={"shout": [{"texts": ["ok", "no"]}]})
    out = run_autograder(MASTER, sub, tmp_path / "results" / "results.json", opts)
    saved = json.loads((tmp_path / "results" / "results.json").read_text())
    assert saved == out and out["score"] == 4
    assert [(t["name"], t["score"], t["max_score"], t["visibility"]) for t in out["tests"]] == [
        ("double", 1.0, 1, "visible"), ("mean", 2.0, 2, "visible"), ("shout", 1.0, 1, "visible"),
        ("shout: hidden cases", 0.0, 0.0, "after_published")]
    assert all(t["status"] == "passed" for t in out["tests"])


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


# -- a real lab ----------------------------------------------------------------------------------

REAL = ROOT / "solutions" / "interleaved-pipeline-lab.ipynb"


@pytest.mark.slow
def test_a_real_lab_unmodified_fails_solved_passes_forged_fails(tmp_path):
    """The cheapest lab with several exercises (3 exercises, 6 points), graded in the default
    sandbox where it runs (else without): unmodified, every exercise fails with the check's own
    message; solved (each stub replaced by the master's solution), full points; forged (one check
    edited to print PASS, another deleted), the same as unmodified."""
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

    box = [] if not Sandbox("bwrap").available() else ["--sandbox", "none", "--unsafe-no-sandbox"]
    subs = [copy("unmodified.ipynb"), copy("solved.ipynb", solve), copy("forged.ipynb", forge)]
    out = subprocess.run([sys.executable, "-m", "labkit.notebooks", "grade", *map(str, subs), "--master",
                          str(REAL), "--json", "--out", str(tmp_path / "grades"), *box],
                         capture_output=True, text=True, cwd=ROOT, timeout=900)
    assert out.returncode == 1, out.stderr
    unmodified, solved, forged = (json.loads(line) for line in out.stdout.splitlines())
    assert [x["id"] for x in solved["exercises"]] == ["interleaved", "bubble", "messages"]
    assert (unmodified["points"], solved["points"], solved["max_points"]) == (0, 6, 6)
    hints = {"interleaved": "the exercise is not written yet", "bubble": "replace None by a number",
             "messages": "replace None by a number"}
    for x in unmodified["exercises"]:
        assert x["status"] == "fail" and hints[x["id"]] in x["message"], x
    assert all(x["status"] == "pass" for x in solved["exercises"])
    assert forged["points"] == 0 and "trust me" not in json.dumps(forged)
    rows = list(csv.reader(open(tmp_path / "grades" / "interleaved-pipeline-lab.csv")))
    assert rows[0][4:] == ["interleaved", "bubble", "messages", "points", "max_points"]


def test_a_check_that_is_not_a_spec_is_graded_in_process_and_says_so(master, tmp_path):
    """A lab whose check cell calls its own function (no labkit.check Spec) is still graded: the
    check cell runs after the answers in the sandboxed process, reported as "in-process"."""
    legacy = copy.deepcopy(master)
    for c in legacy.cells:
        if c.metadata.get("labkit", {}).get("exercise") == "double":
            c.metadata["labkit"]["exercise"] = "legacy-double"
    cells = _cells(legacy)
    cells["setup"].source += ("\nfrom labkit.check import report\n\n\ndef check_double_here(fn):\n"
                              "    ok = all(fn(x) == 2 * x for x in (0, 3))\n"
                              "    return report('double', ok, 'twice' if ok else 'not twice', 'hint here')")
    cells["double-check"].source = "passed = check_double_here(double)"
    path = tmp_path / "legacy-master.ipynb"
    nbformat.write(legacy, path)
    sub = tmp_path / "sub.ipynb"
    notebooks.student_copy(path, sub)
    for solved, points in ((False, 0), (True, 1)):
        if solved:
            nb = nbformat.read(sub, as_version=4)
            _cells(nb)["double-stub"].source = "def double(x):\n    return 2 * x"
            nbformat.write(nb, sub)
        r = _by_id(grade_one(load_master(path), path, sub, NONE))["legacy-double"]
        assert r["checked"] == "in-process" and r["points"] == points, r


def test_sandbox_commands_bind_only_what_a_submission_needs(tmp_path):
    from labkit.notebooks.sandbox import INSIDE, Limits
    root = Sandbox().labkit_root
    argv = Sandbox("bwrap").argv(tmp_path, "job")
    for flag in ("--unshare-pid", "--unshare-net", "--die-with-parent", "--new-session", "--clearenv"):
        assert flag in argv
    binds = [(argv[i], argv[i + 1], argv[i + 2]) for i, a in enumerate(argv) if a in ("--bind", "--ro-bind", "--ro-bind-try")]
    assert not [b for b in binds if b[0] == "--bind"]                   # nothing of the host is writable
    assert ("--ro-bind", str(tmp_path / "submission.ipynb"), "/grade/submission.ipynb") in binds
    sized = [argv[i + 3] for i, a in enumerate(argv) if a == "--size"]   # --size N --tmpfs DIR
    assert sorted(sized) == ["/dev/shm", "/grade", "/tmp"] and argv.count(str(Limits().disk_bytes)) == 3
    assert "--seccomp" not in argv
    assert "7" == (lambda a: a[a.index("--seccomp") + 1])(Sandbox("bwrap").argv(tmp_path, "job", 7))
    assert ("--ro-bind", str(root / "labkit"), f"{INSIDE}/labkit") in binds
    sources = [b[1] for b in binds]
    under_root = sorted(s for s in sources if s == str(root) or s.startswith(str(root) + "/"))
    assert under_root == [str(root / "data"), str(root / "labkit")]     # no masters, no hidden tests
    assert "/" not in sources and not any(s.startswith("/home") for s in sources)
    docker = Sandbox("docker", image="labkit:grade").argv(tmp_path, "job")
    for flag in ("--network", "none", "--read-only", "--cap-drop", "ALL", "--pids-limit", "labkit:grade"):
        assert flag in docker
    assert Limits().memory_bytes == 6 * 2**30 and Sandbox("none").argv(tmp_path, "job")[1:3] == ["-P", "-s"]


def test_one_jobs_clean_up_never_kills_another_jobs_runner_while_it_starts(tmp_path):
    """Grading threads share one process: a child between fork and registration is not a stray.
    (CI once saw a runner die with "exit code 0" and no events: another job's clean-up had killed and
    reaped it while its Popen was still starting it.)"""
    import threading
    import time

    from labkit.notebooks import children
    before = children.children()
    mark = tmp_path / "ran"
    started = []
    spawn = threading.Thread(target=lambda: started.append(children.spawn(
        ["sh", "-c", f"echo ran > {mark}"], preexec_fn=lambda: time.sleep(1.0))))   # fork, then 1 s before exec
    spawn.start()
    time.sleep(0.3)                          # the child exists now and is not registered yet
    children.reap(before)                    # another job ending: kills what appeared since its start
    spawn.join()
    proc = started[0]
    try:
        assert proc.wait(timeout=10) == 0
        assert mark.read_text() == "ran\n", "the starting child was killed as a stray"
    finally:
        children.LIVE.discard(proc.pid)

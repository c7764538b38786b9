"""A hostile submission cannot reach out of the grader (issue 23, "One student can change another
student's grade"): each attack of the issue, as a submission this file builds, graded for real in
the default sandbox (bubblewrap), next to an honest student who submitted the untouched stub.

What each test proves: the attack changes no file outside its folder (labkit, the master, the
gradebook, a file of the instructor's), no grade but its own, leaves no process behind, cannot
kill the grader, cannot read the master or put it in a grade message; a killed grader loses
nothing already graded; output paths are never followed through links; the grader refuses to run
without a sandbox unless told. Each grading is one exercise of tests/fixtures/tiny-master.ipynb
(about 1 s per submission on an idle 2-core machine). Skipped, with the reason, where bwrap cannot
run (install Debian's bubblewrap).
"""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat", reason="the notebook tools (requirements.txt) are not installed")

from labkit import notebooks
from labkit.notebooks.sandbox import Sandbox

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "tests" / "fixtures" / "tiny-master.ipynb"
WHY = Sandbox("bwrap").available()
pytestmark = pytest.mark.skipif(bool(WHY), reason=f"the sandbox cannot run here: {WHY}")


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """A one-exercise master (the tiny lab's "double"), its honest student and a place for grades."""
    d = tmp_path_factory.mktemp("class")
    nb = nbformat.read(TINY, as_version=4)
    keep = {"title", "setup", "double-text", "double-stub", "double-solution", "double-check"}
    nb.cells = [c for c in nb.cells if c.id in keep]
    master = d / "solutions" / "double-lab.ipynb"
    master.parent.mkdir()
    nbformat.write(nb, master)
    honest = d / "honest.ipynb"
    notebooks.student_copy(master, honest)
    return {"dir": d, "master": master, "honest": honest}


def submission(lab, name: str, code: str) -> Path:
    """The student copy with ``code`` as the answer cell (the attack runs when grading)."""
    path = lab["dir"] / f"{name}.ipynb"
    notebooks.student_copy(lab["master"], path)
    nb = nbformat.read(path, as_version=4)
    next(c for c in nb.cells if c.id == "double-stub").source = code
    nbformat.write(nb, path)
    return path


def grade(lab, *subs, out="grades", extra=(), timeout=120):
    out_dir = lab["dir"] / out
    proc = subprocess.run([sys.executable, "-m", "labkit.notebooks", "grade", *map(str, subs), "--master",
                           str(lab["master"]), "--out", str(out_dir), "--json", "--timeout", "20", *extra],
                          capture_output=True, text=True, cwd=ROOT, timeout=timeout)
    results = {Path(r["submission"]).stem: r for r in map(json.loads, proc.stdout.splitlines())}
    return proc, results, out_dir


SOLVED = "def double(x):\n    return 2 * x\n"


def test_a_submission_cannot_change_labkit_the_master_or_the_next_grade(lab):
    targets = [ROOT / "labkit" / "check" / "example.py", lab["master"], "/opt/labkit/labkit/check/example.py"]
    before = {str(t): Path(t).read_bytes() for t in targets[:2]}
    attack = ("import pathlib\nfor t in %r:\n    try:\n        p = pathlib.Path(t)\n"
              "        p.write_text(p.read_text().replace('got != 2 * x', 'False'))\n"
              "    except OSError as e:\n        print('blocked', e)\n" % [str(t) for t in targets]) + SOLVED
    proc, r, _ = grade(lab, submission(lab, "attacker", attack), lab["honest"])
    assert proc.returncode == 1, proc.stderr
    assert {str(t): Path(t).read_bytes() for t in targets[:2]} == before     # labkit and the master as they were
    assert r["attacker"]["points"] == 1 and r["honest"]["points"] == 0       # the next student: still the stub's 0
    assert r["honest"]["exercises"][0]["status"] == "fail"


def test_a_background_process_dies_with_its_grading_and_never_writes_the_gradebook(lab, tmp_path):
    marker = tmp_path / "written-later"
    attack = (f"import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
              f"        time.sleep(3)\n        for p in [{str(marker)!r}, {str(lab['dir'] / 'grades' / 'double-lab.csv')!r}]:\n"
              f"            try:\n                open(p, 'w').write('attacker 1')\n            except OSError:\n"
              f"                pass\n    os._exit(0)\n") + SOLVED
    proc, r, out = grade(lab, submission(lab, "daemon", attack), lab["honest"], out="grades")
    csv_text = (out / "double-lab.csv").read_text()
    time.sleep(4)                                    # the daemon would have woken up by now
    assert not marker.exists()
    assert (out / "double-lab.csv").read_text() == csv_text and "daemon" in csv_text
    assert r["honest"]["points"] == 0


def test_killing_the_grader_from_a_submission_fails_and_later_students_are_graded(lab):
    attack = "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\n" + SOLVED
    proc, r, out = grade(lab, submission(lab, "killer", attack), lab["honest"], out="grades-kill")
    assert set(r) == {"killer", "honest"}, proc.stderr
    book = json.loads((out / "double-lab.json").read_text())
    assert [Path(s["submission"]).stem for s in book["submissions"]] == ["killer", "honest"]


def test_a_submission_cannot_read_the_master_or_leak_it_into_grade_messages(lab):
    attack = ("import glob, pathlib\nfound = []\nfor pattern in [%r, %r, '../*.ipynb', '../*/*.ipynb',\n"
              "                '/opt/labkit/*/*.ipynb', '/tmp/*/*/*.ipynb']:\n"
              "    for f in glob.glob(pattern):\n"
              "        try:\n            found.append(pathlib.Path(f).read_text())\n        except OSError:\n"
              "            pass\n"
              "src = ''.join(found)\n"
              "if 'double-' + 'solution' in src:             # the master's solution cell: copy it\n"
              "    exec('def double(x):\\n    return x + x')\n"
              "raise ValueError('KEY' + src * 10)\n") % (str(lab["master"]), str(ROOT / "solutions" / "*.ipynb"))
    proc, r, out = grade(lab, submission(lab, "reader", attack), out="grades-read")
    ex = r["reader"]["exercises"][0]
    assert r["reader"]["points"] == 0 and ex["status"] == "fail", ex
    book = (out / "double-lab.json").read_text()
    assert "double-solution" not in book and "return 2 * x" not in book   # nothing of the master leaked
    assert "KEY" in ex["message"] and len(ex["message"]) < 1000


def test_output_paths_are_never_followed_and_a_folder_in_their_place_is_refused(lab, tmp_path):
    victim = tmp_path / "instructor-notes.txt"
    victim.write_text("mine")
    out = lab["dir"] / "grades-link"
    out.mkdir()
    (out / "double-lab.csv").symlink_to(victim)
    proc, _, _ = grade(lab, lab["honest"], out="grades-link")
    assert proc.returncode == 2 and "symbolic link" in proc.stderr and victim.read_text() == "mine"
    out2 = lab["dir"] / "grades-dir"
    (out2 / "double-lab.json").mkdir(parents=True)
    proc, _, _ = grade(lab, lab["honest"], out="grades-dir")
    assert proc.returncode == 2 and "is a folder" in proc.stderr


def test_a_killed_grader_keeps_every_submission_graded_so_far_and_resumes(lab):
    slow = submission(lab, "zz-slow", "import time\ntime.sleep(30)\n" + SOLVED)
    subs = [lab["honest"], submission(lab, "solved", SOLVED), slow]
    out = lab["dir"] / "grades-crash"
    proc = subprocess.Popen([sys.executable, "-m", "labkit.notebooks", "grade", *map(str, subs), "--master",
                             str(lab["master"]), "--out", str(out), "--json", "--timeout", "60"],
                            stdout=subprocess.PIPE, text=True, cwd=ROOT)
    seen = [proc.stdout.readline() for _ in range(2)]         # two submissions graded...
    proc.send_signal(signal.SIGKILL)                           # ...then the grader is killed
    proc.wait(30)
    book = json.loads((out / "double-lab.json").read_text())
    assert [Path(s["submission"]).stem for s in book["submissions"]] == ["honest", "solved"], seen
    assert (out / "double-lab.csv").read_text().count("\n") == 3
    slow.write_text(submission(lab, "zz-slow", SOLVED).read_text())   # resubmitted, fast this time
    proc, r, _ = grade(lab, *subs, out="grades-crash", extra=["--resume"])
    assert list(r) == ["zz-slow"]
    assert len(json.loads((out / "double-lab.json").read_text())["submissions"]) == 3


def test_no_sandbox_is_refused_unless_asked_for(lab):
    proc, _, _ = grade(lab, lab["honest"], out="grades-none", extra=["--sandbox", "none"])
    assert proc.returncode == 2 and "--unsafe-no-sandbox" in proc.stderr
    assert not (lab["dir"] / "grades-none" / "double-lab.json").exists()

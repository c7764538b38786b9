"""The grader from a reader's virtual environment (issue 33, "an interpreter that is the instructor's").

A plain ``python -m venv`` whose packages (labkit, torch, nbformat) are reachable only through the
venv's own ``site-packages`` (a ``.pth`` file, as ``pip install -e .`` writes one): its base
interpreter, which a sandbox started as ``os.path.realpath(sys.executable)`` once ran, sees none
of them, and the collectives lab's master then got 0 ("ModuleNotFoundError: torch"). Graded from
that venv with a *relative* ``--workdir`` and an empty verdict cache, the master must be proven
first (preflight) and the student copy then graded. The preflight's refusal is tested here too,
without a sandbox (a hidden case the master cannot pass stands for a broken set-up).
"""
import json
import os
import site
import subprocess
import sys
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat", reason="the notebook tools (requirements.txt) are not installed")

from labkit import notebooks
from labkit.notebooks.gradebook import grade, load_master
from labkit.notebooks.grader import Options
from labkit.notebooks.preflight import SetupError, check_master
from labkit.notebooks.integrity import Fingerprint
from labkit.notebooks.sandbox import Sandbox

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "tests" / "fixtures" / "tiny-master.ipynb"
WHY = Sandbox("bwrap").available()


def _one_exercise_master(d: Path) -> Path:
    """The collectives lab's master with its first exercise only (ranks on gloo: torch is needed)."""
    nb = nbformat.read(ROOT / "solutions" / "collectives-lab.ipynb", as_version=4)
    drop = {"ring-all-reduce"}
    nb.cells = [c for c in nb.cells if c.get("metadata", {}).get("labkit", {}).get("exercise") not in drop]
    path = d / "solutions" / "gather-lab.ipynb"
    path.parent.mkdir(parents=True)
    nbformat.write(nb, path)
    return path


@pytest.mark.slow
@pytest.mark.skipif(bool(WHY), reason=f"the sandbox cannot run here: {WHY}")
def test_a_plain_venv_grades_the_master_full_with_a_relative_workdir(tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
    py = venv / "bin" / "python"
    inner = subprocess.run([str(py), "-c", "import site; print(site.getsitepackages()[0])"],
                           capture_output=True, text=True, check=True).stdout.strip()
    # the venv sees labkit (this checkout) and the system's packages only through its own .pth
    Path(inner, "labkit-dev.pth").write_text("\n".join([str(ROOT), *site.getsitepackages()]) + "\n")
    master = _one_exercise_master(tmp_path / "class")
    student = tmp_path / "class" / "alice.ipynb"
    notebooks.student_copy(master, student)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env["XDG_CACHE_HOME"] = str(tmp_path / "cache")            # no cached verdict: the master is graded
    proc = subprocess.run([str(py), "-m", "labkit.notebooks", "grade", "alice.ipynb", "--master",
                           "solutions/gather-lab.ipynb", "--workdir", "work", "--out", "grades", "--json",
                           "--timeout", "60"], cwd=tmp_path / "class", env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 1, proc.stderr[-3000:]           # the student copy fails, nothing broke
    (row,) = map(json.loads, proc.stdout.splitlines())
    assert row["points"] == 0 and "NotImplementedError" in row["exercises"][0]["message"], row
    cached = list((tmp_path / "cache" / "labkit" / "master-checks").glob("*.json"))
    assert len(cached) == 1 and json.loads(cached[0].read_text()) == {"points": 2.0, "max_points": 2}


def test_the_sandbox_starts_the_environments_own_python_not_its_realpath(tmp_path, monkeypatch):
    link = tmp_path / "venv" / "bin" / "python"
    link.parent.mkdir(parents=True)
    link.symlink_to(os.path.realpath(sys.executable))
    monkeypatch.setattr(sys, "executable", str(link))
    argv = Sandbox("bwrap").argv(tmp_path / "work", "x")
    assert str(link) in argv and argv[argv.index(str(link)) + 1] == "-P"
    assert ["--ro-bind", str(tmp_path / "venv"), str(tmp_path / "venv")] == \
        argv[argv.index(str(tmp_path / "venv")) - 1:argv.index(str(tmp_path / "venv")) + 2]


def test_a_master_short_of_full_marks_stops_grading_before_any_student(tmp_path, monkeypatch):
    master = load_master(TINY)
    opts = Options(sandbox=Sandbox("none"), timeout=20, hidden={"double": [{"xs": 5}]})
    fp = Fingerprint.of(opts.sandbox.labkit_root, TINY)
    with pytest.raises(SetupError, match=r"(?s)gets 3.5/4 points.*double: partial"):
        check_master(master, TINY, opts, fp, cache=tmp_path / "cache")
    assert not list((tmp_path / "cache").glob("*.json"))          # a refusal is never cached
    student = tmp_path / "bob.ipynb"
    notebooks.student_copy(TINY, student)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    with pytest.raises(SetupError):
        grade([student], TINY, tmp_path / "grades", opts)
    assert not (tmp_path / "grades" / "tiny-master.json").exists()

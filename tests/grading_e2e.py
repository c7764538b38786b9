"""One lab graded end to end as an instructor grades it (the grading slice, tests/conftest.py GRADING):
the master, its student copy and an attack (the student copy with one stub replaced), through
``python -m labkit.notebooks grade --json`` in bubblewrap when it is installed (else without a sandbox,
which the command must be told). Returns the three gradebook rows."""
import json
import subprocess
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]


def grade_master_student_attack(master: Path, tmp_path: Path, is_stub, attack_source: str,
                                timeout: float = 900) -> tuple[dict, dict, dict]:
    """(solved, student, attack) rows; ``is_stub(metadata)`` picks the stub the attack replaces."""
    from labkit.notebooks import student_copy
    from labkit.notebooks.sandbox import Sandbox
    subs = [tmp_path / "solved.ipynb", tmp_path / "student.ipynb", tmp_path / "attack.ipynb"]
    subs[0].write_bytes(master.read_bytes())
    student_copy(master, subs[1])
    nb = nbformat.read(subs[1], as_version=4)
    next(c for c in nb.cells if is_stub(c.metadata.get("labkit", {}))).source = attack_source
    nbformat.write(nb, subs[2])
    box = [] if not Sandbox("bwrap").available() else ["--sandbox", "none", "--unsafe-no-sandbox"]
    out = subprocess.run([sys.executable, "-m", "labkit.notebooks", "grade", *map(str, subs), "--master", str(master),
                          "--json", "--out", str(tmp_path / "grades"), *box],
                         capture_output=True, text=True, cwd=ROOT, timeout=timeout)
    rows = [json.loads(line) for line in out.stdout.splitlines()]
    assert len(rows) == 3, out.stderr[-2000:]
    return tuple(rows)


def assert_full_zero_zero(solved: dict, student: dict, attack: dict, points: int, cases: list) -> None:
    """The master gets every point (``cases``: visible + hidden cases per exercise), the student copy 0
    (its first exercise "not written yet"), the attack 0, told it called labkit's own implementation."""
    assert (solved["points"], solved["max_points"]) == (points, points), solved
    assert [len(x["cases"]) for x in solved["exercises"]] == cases
    assert student["points"] == 0 and "not written yet" in student["exercises"][0]["message"]
    assert attack["points"] == 0 and "trust me" not in json.dumps(attack)
    assert "labkit's own implementation" in attack["exercises"][0]["message"], attack["exercises"][0]

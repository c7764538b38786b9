"""Every lab's master gets full marks when graded from a fresh ``python -m venv`` (issue 33).

One venv for all the labs, made as ``tests/test_grader_venv.py`` makes its own: ``--without-pip``,
labkit (this checkout) and the system's packages (torch, nbformat) reachable only through a ``.pth``
in the venv's ``site-packages``, so a sandbox started with the base interpreter would see no torch.
From that venv, with a relative working folder, each master in ``solutions/`` is graded as the
grader's preflight grades it (``grade_one`` of the master against itself, hidden cases included,
in bubblewrap with the default limits and per-run memory cap), and must get full marks. Each
exercise's memory peak (all processes of its runs, where a cgroup measures it) is printed.
Slow (every lab's every exercise in a sandbox: 3,567 s for 12 labs on the 2-core machine under a
load of 40-60, 2026-11-28), so outside the README's suite and its 15-minute budget: an instructor's
check before a term, ``LABKIT_GRADE_ALL=1 pytest tests/test_grader_venv_masters.py``. The suite keeps
the collectives master's venv test (tests/test_grader_venv.py).
"""
import json
import os
import site
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("nbformat", reason="the notebook tools (requirements.txt) are not installed")

from labkit.notebooks.sandbox import Sandbox

ROOT = Path(__file__).resolve().parents[1]
WHY = Sandbox("bwrap").available()
MASTERS = sorted((ROOT / "solutions").glob("*-lab.ipynb"))

GRADE_ALL = '''
import json, sys, time
from pathlib import Path
from labkit.notebooks.gradebook import load_hidden, load_master
from labkit.notebooks.grader import Options, grade_one
from labkit.notebooks.sandbox import Sandbox
for path in map(Path, sys.argv[1:]):
    t0 = time.monotonic()
    opts = Options(sandbox=Sandbox("bwrap"), timeout=240, hidden=load_hidden(path), workdir="work")
    r = grade_one(load_master(path), path, path, opts)
    print(json.dumps({"lab": path.stem, "points": r["points"], "max_points": r["max_points"],
                      "seconds": round(time.monotonic() - t0, 1),
                      "bad": [(x["id"], x["status"], x["message"][:300]) for x in r["exercises"] if x["points"] != x["max_points"]],
                      "peak_mib": {x["id"]: x.get("peak_mib") for x in r["exercises"]}}), flush=True)
'''


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("LABKIT_GRADE_ALL"),
                    reason="an hour on 2 cores: LABKIT_GRADE_ALL=1 runs it (an instructor's check before a term)")
@pytest.mark.skipif(bool(WHY), reason=f"the sandbox cannot run here: {WHY}")
def test_every_master_gets_full_marks_from_a_plain_venv(tmp_path):
    assert len(MASTERS) >= 12
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
    py = venv / "bin" / "python"
    inner = subprocess.run([str(py), "-c", "import site; print(site.getsitepackages()[0])"],
                           capture_output=True, text=True, check=True).stdout.strip()
    Path(inner, "labkit-dev.pth").write_text("\n".join([str(ROOT), *site.getsitepackages()]) + "\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    proc = subprocess.run([str(py), "-c", GRADE_ALL, *map(str, MASTERS)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=3600)
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    for row in rows:
        print(row)
    assert [r["lab"] for r in rows] == [m.stem for m in MASTERS], proc.stderr[-3000:]
    bad = [r for r in rows if r["points"] != r["max_points"] or r["bad"]]
    assert not bad, bad

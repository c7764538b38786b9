"""The grader's own limits and a submission's caps (issue 33, "the judge under limits", "a budget per
submission").

* The judge runs in a worker process (``labkit.notebooks.judge``) with a time and a memory limit: a
  judge that loops, or allocates without bound, fails that case with the reason, the worker is
  stopped, and the next verdict (an honest one) is given by a fresh worker.
* Graded for real in bubblewrap (tiny lab's "double"): a submission that writes 4 GiB is killed by
  the per-run memory cgroup and reported as "memory limit"; one that creates 20,000 files in
  ``/tmp`` is stopped at the tmpfs's inode cap; one that opens 5,000 files at ``RLIMIT_NOFILE``;
  the honest student in the same run gets full marks.
* The docker command line carries the same limits (docker is not installed here: the argv is checked).
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from labkit.check.registry import find
from labkit.notebooks.caps import cgroup_why, inode_cap_why
from labkit.notebooks.judge import Judge, JudgeLimits
from labkit.notebooks.sandbox import Limits, Sandbox

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"
TINY = FIXTURES / "tiny-master.ipynb"
WHY = Sandbox("bwrap").available()


def _verdicts(judge, order):
    sys.path.insert(0, str(FIXTURES))
    try:
        mods = ("judge_bombs",)
        from labkit.check.registry import MODULES
        specs = {k: find(k, MODULES + mods) for k in set(order)}
    finally:
        sys.path.remove(str(FIXTURES))
    out = {}
    for name in order:
        try:
            out.setdefault(name, []).append(judge.verdict(specs[name], [2.0], {})["passed"])
        except Exception as e:  # noqa: BLE001 - what the grader would report
            out.setdefault(name, []).append(f"{type(e).__name__}: {e}")
    return out


def test_a_judge_that_loops_or_allocates_is_stopped_and_the_next_verdict_is_given():
    judge = Judge(JudgeLimits(memory_bytes=3 * 2**30, total_bytes=0, seconds=5), ("judge_bombs",), (FIXTURES,))
    try:
        out = _verdicts(judge, ("judge-honest", "judge-loops", "judge-honest", "judge-reserves", "judge-honest"))
    finally:
        judge.stop()
    assert out["judge-honest"] == [True, True, True], out
    assert out["judge-loops"] == ["JudgeFailure: the judge ran over its time limit (5 s) and was stopped"], out
    assert out["judge-reserves"][0].startswith("JudgeFailure: the judge ran out of its memory limit (3 GiB"), out


@pytest.mark.skipif(bool(cgroup_why()), reason=f"no per-run memory cgroup here: {cgroup_why()}")
def test_a_judge_over_its_cgroup_is_killed_and_reported():
    judge = Judge(JudgeLimits(memory_bytes=64 * 2**30, total_bytes=2**30, seconds=120), ("judge_bombs",),
                  (FIXTURES,))
    try:
        out = _verdicts(judge, ("judge-honest", "judge-allocates", "judge-honest"))
    finally:
        judge.stop()
    assert out["judge-honest"] == [True, True], out
    assert out["judge-allocates"] == ["JudgeFailure: the judge ran out of its memory limit (64 GiB per process, "
                                      "1 GiB in all)"], out


def test_the_grader_reports_a_judge_failure_as_that_cases_message():
    from labkit.notebooks.grader import judge_outcome
    from labkit.notebooks.sandbox import Outcome
    from labkit.notebooks.schema import Exercise
    sys.path.insert(0, str(FIXTURES))
    try:
        from labkit.check.registry import MODULES
        spec = find("judge-loops", MODULES + ("judge_bombs",))
    finally:
        sys.path.remove(str(FIXTURES))
    out = Outcome()
    out.events = [{"event": "cells", "errors": []}, {"event": "case", "index": 0},
                  {"event": "data", "index": 0, "data": [2.0]}, {"event": "done"}]
    judge = Judge(JudgeLimits(seconds=3), ("judge_bombs",), (FIXTURES,))
    try:
        r = judge_outcome(Exercise("judge-loops", 2, "", 1, frozenset()), spec, [({}, False)], out, 10.0,
                          judge=judge)
    finally:
        judge.stop()
    assert r["points"] == 0 and r["status"] == "fail", r
    assert "could not judge what your code produced: the judge ran over its time limit (3 s)" in r["message"], r


def test_the_docker_command_carries_the_limits(tmp_path):
    lim = Limits(disk_bytes=2**28, files=1000, total_memory_bytes=3 * 2**30, open_files=512)
    argv = Sandbox("docker", image="labkit-grader", limits=lim).argv(tmp_path, "job")
    text = " ".join(argv)
    assert "--tmpfs /tmp:rw,nosuid,nodev,size=268435456,nr_inodes=1000,mode=1777" in text
    assert "--tmpfs /grade:rw,nosuid,nodev,size=268435456,nr_inodes=1000,mode=1777" in text
    assert "--shm-size 268435456" in text and f"--memory {3 * 2**30} --memory-swap {3 * 2**30}" in text
    assert "--ulimit nofile=512:512" in text and "--network none" in text and "--cap-drop ALL" in text
    assert f"{tmp_path / 'submission.ipynb'}:/grade/submission.ipynb:ro" in argv     # only the notebook, read-only
    assert not any(a.startswith(f"{tmp_path}:") for a in argv)                    # not the host folder
    assert "seccomp=unconfined" not in text                                    # docker's default profile stays


HOG = "big = b'x' * (4 << 30)\ndef double(x):\n    return 2 * x\n"
FILES = ("made = 0\ntry:\n    for i in range(20000):\n        open(f'/tmp/f{i}', 'w').close()\n        made += 1\n"
         "except OSError as e:\n    why = e.errno\ndef double(x):\n    return 2 * x if made < 1000 and why == 28 else -1\n")
FDS = ("import os\nfds = []\ntry:\n    for i in range(5000):\n        fds.append(os.open('/dev/null', os.O_RDONLY))\n"
       "except OSError as e:\n    why = e.errno\ndef double(x):\n    return 2 * x if len(fds) < 1024 and why == 24 else -1\n")


@pytest.mark.slow
@pytest.mark.skipif(bool(WHY), reason=f"the sandbox cannot run here: {WHY}")
@pytest.mark.skipif(bool(cgroup_why() or inode_cap_why()), reason=f"no cap here: {cgroup_why() or inode_cap_why()}")
def test_memory_files_and_open_files_capped_honest_full(tmp_path):
    import nbformat
    from labkit import notebooks
    nb = nbformat.read(TINY, as_version=4)
    keep = {"title", "setup", "double-text", "double-stub", "double-solution", "double-check"}
    nb.cells = [c for c in nb.cells if c.id in keep]
    master = tmp_path / "solutions" / "double-lab.ipynb"
    master.parent.mkdir()
    nbformat.write(nb, master)
    subs = []
    for name, code in (("honest", "def double(x):\n    return 2 * x\n"), ("hog", HOG), ("files", FILES), ("fds", FDS)):
        path = tmp_path / f"{name}.ipynb"
        notebooks.student_copy(master, path)
        s = nbformat.read(path, as_version=4)
        next(c for c in s.cells if c.id == "double-stub").source = code
        nbformat.write(s, path)
        subs.append(path)
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    proc = subprocess.run([sys.executable, "-m", "labkit.notebooks", "grade", *map(str, subs), "--master",
                           str(master), "--out", str(tmp_path / "grades"), "--json", "--timeout", "60",
                           "--max-files", "1000"],
                          capture_output=True, text=True, cwd=ROOT, timeout=600, env=env)
    rows = {Path(r["submission"]).stem: r for r in map(json.loads, proc.stdout.splitlines())}
    assert set(rows) == {"honest", "hog", "files", "fds"}, proc.stderr[-3000:]
    assert rows["honest"]["points"] == 1 and rows["files"]["points"] == 1 and rows["fds"]["points"] == 1, rows
    hog = rows["hog"]["exercises"][0]
    assert hog["points"] == 0 and hog["status"] == "error", hog
    assert hog["message"].startswith("memory limit: your code used more than 3 GiB for all its processes"), hog
    assert hog["peak_mib"] == 3 * 1024 and rows["honest"]["exercises"][0]["peak_mib"] < 256, rows

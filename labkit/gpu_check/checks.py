"""The checks: ``pytest -m gpu`` on the repository's tests folder, one result per test.

Tests needing more GPUs than the machine has are skipped by tests/conftest.py with that reason, and
the report lists them as skipped. pytest's JUnit XML (``--junitxml``) carries each result.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

TESTS = Path(__file__).resolve().parents[2] / "tests"   # the repository's tests/ (editable install)


def parse_junit(text: str) -> list:
    """[{"name", "outcome" (passed/failed/error/skipped), "seconds", "message"}] from JUnit XML."""
    rows = []
    for case in ET.fromstring(text).iter("testcase"):
        outcome, message = "passed", ""
        for tag in ("failure", "error", "skipped"):
            node = case.find(tag)
            if node is not None:
                outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[tag]
                lines = (node.text or "").strip().splitlines()
                message = node.get("message") or (lines[-1] if lines else "")
                break
        rows.append({"name": f"{case.get('classname', '')}::{case.get('name', '')}", "outcome": outcome, "seconds": float(case.get("time") or 0),
                     "message": message})
    return rows


def summary(tests: list) -> dict:
    counts = {k: 0 for k in ("passed", "failed", "error", "skipped")}
    for t in tests:
        counts[t["outcome"]] += 1
    return counts


def run(out_dir: Path, timeout: float, tests_dir: Path = TESTS, say=print) -> dict:
    """Run the gpu-marked tests in a child process; its output goes to gpu-tests.log."""
    if not tests_dir.is_dir():
        return {"error": f"no tests folder at {tests_dir} (run gpu-check from a clone of the repository)",
                "tests": [], "summary": summary([])}
    out_dir = Path(out_dir).resolve()   # pytest runs from the repository root
    xml, log = out_dir / "gpu-tests.xml", out_dir / "gpu-tests.log"
    cmd = [sys.executable, "-m", "pytest", "-m", "gpu", str(tests_dir), "-p", "no:cacheprovider",
           "-rA", f"--junitxml={xml}", "--continue-on-collection-errors",  # a missing optional
           # package (a notebook stack on a GPU image) costs its own modules only, not every check
           "-o", "addopts="]  # the project's addopts name nbval's sanitizer; tests/ holds no notebooks
    say(f"gpu-check: running {' '.join(cmd[2:])} (log: {log}) ...")
    with open(log, "w") as f:  # own session: a timeout stops pytest and the ranks it launched
        proc = subprocess.Popen(cmd, cwd=tests_dir.parent, stdout=f, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            rc, error = proc.wait(timeout=timeout), None
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            rc, error = proc.wait(), f"stopped after {timeout:g} s (see {log.name})"
    tests = parse_junit(xml.read_text()) if xml.exists() else []
    result = {"command": " ".join(cmd[2:]), "returncode": rc, "tests": tests,
              "summary": summary(tests), "log": log.name}
    if error or (rc not in (0, 5) and not tests):  # 5: nothing collected
        result["error"] = error or f"pytest exited with {rc} and reported no test (see {log.name})"
    counts = result["summary"]
    say(f"gpu-check: checks: {counts['passed']} passed, {counts['failed'] + counts['error']} failed, "
        f"{counts['skipped']} skipped")
    return result

"""The wire from the sandbox to the grader is a schema (issue 33, "One submission stops everyone after it").

Every line the runner writes is the submission's to choose. Fuzzed here (Hypothesis: random bytes,
random JSON, and hostile lines: ``"[" * 100000``, forged ``cells`` events, unknown kinds, wrong field
types, huge numbers) through the grader's own reading (``events.parse``) and judging
(``grader.judge_outcome``): nothing raises out of them, whatever the lines. Then for real, in one
grading run: submissions that write such lines on the runner's answer pipe each get 0 with a
protocol error, the honest student after them gets full marks, and ``--resume`` goes past all of them.
"""
import json
import subprocess
import sys
from pathlib import Path

import pytest

hypothesis = pytest.importorskip("hypothesis", reason="Hypothesis (requirements-dev) is not installed")
nbformat = pytest.importorskip("nbformat", reason="the notebook tools (requirements.txt) are not installed")
from hypothesis import HealthCheck, given, settings, strategies as st

from labkit import notebooks
from labkit.check.registry import find
from labkit.notebooks import events
from labkit.notebooks.grader import judge_outcome
from labkit.notebooks.sandbox import Outcome, Sandbox
from labkit.notebooks.schema import Exercise

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "tests" / "fixtures" / "tiny-master.ipynb"

HOSTILE = [b"[" * 100000, b"{" * 50000, b'{"event":"cells","errors":[[1,2],[3]]}', b'{"event":"cells","errors":7}',
           b'{"event":"cell","index":true,"where":"x"}', b'{"event":"case","index":1e308}',
           b'{"event":"data","index":0,"data":' + b"[" * 60 + b"]" * 60 + b"}",
           b'{"event":"junk","blob":"' + b"x" * 4096 + b'"}', b'{"event":"done","extra":[1,2]}',
           b'{"event":"data","index":0,"data":{"__tensor__":"float64","shape":[1000000000],"data":[]}}',
           b'{"event":"data","index":0,"data":[NaN, Infinity, -Infinity]}', b"\xff\xfe", b"",
           b'{"event":"legacy","stdout":"\x1b[32m[check] PASS\x1b[0m","error":0}',
           b'{"event":"cell","index":99999999999999999999999,"where":"x"}']
JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
                    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids, max_size=4),
                    max_leaves=30)
EVENT = st.fixed_dictionaries({"event": st.sampled_from(["cell", "cells", "case", "data", "legacy", "error",
                                                         "done", "x"])}, optional={
    "index": JSON, "where": JSON, "errors": JSON, "data": JSON, "stdout": JSON, "error": JSON, "message": JSON})
LINE = (st.binary(max_size=200) | st.sampled_from(HOSTILE)
        | JSON.map(lambda v: json.dumps(v).encode()) | EVENT.map(lambda v: json.dumps(v).encode()))


def _read(lines) -> Outcome:
    """What run_job keeps of these lines: the parsed events, up to the first broken one."""
    out = Outcome()
    for line in lines:
        try:
            out.events.append(events.parse(line))
        except events.ProtocolError as e:
            out.state, out.detail = "protocol", str(e)
            break
    return out


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(LINE, max_size=6), st.sampled_from(["double", "mean", "shout", "bubble", "one-f-one-b"]))
def test_no_line_breaks_the_grader(lines, spec_id):
    spec = find(spec_id)
    ex = Exercise(spec_id, 2, "", 1, frozenset())
    cases = [(dict(c), False) for c in spec.cases] + [(dict(c), True) for c in spec.cases]
    out = _read(lines)
    for ev in out.events:                   # what passes is rebuilt from exact types
        assert type(ev) is dict and type(ev["event"]) is str
        assert all(type(ev[k]) is int for k in ("index",) if k in ev)
        assert all(type(ev[k]) is str and "\x1b" not in ev[k] for k in ("where", "stdout", "error", "message")
                   if k in ev)
    r = judge_outcome(ex, spec, cases, out, 10.0)
    assert 0 <= r["points"] <= 2 and r["status"] in ("pass", "partial", "fail", "error", "timeout")
    assert all(ch not in r["message"] for ch in "\x1b\x07\x00")


def test_hostile_lines_are_refused_cheaply():
    import time
    for line in HOSTILE:
        t0 = time.perf_counter()
        try:
            events.parse(line)
        except events.ProtocolError:
            pass
        assert time.perf_counter() - t0 < 0.5, line[:40]
    with pytest.raises(events.ProtocolError, match="deeper"):
        events.parse(b"[" * 100000)
    with pytest.raises(events.ProtocolError, match="errors"):
        events.parse(b'{"event":"cells","errors":[[1,2]]}')
    with pytest.raises(events.ProtocolError, match="unknown kind"):
        events.parse(b'{"event":"junk"}')


# -- for real: hostile lines on the runner's own answer pipe, in one grading run ----------------
PIPE = ("import gc\nch = next(o for o in gc.get_objects() if type(o).__name__ == 'Channel')\n"
        "ch.write({})\ndef double(x):\n    return 2 * x\n")
ATTACKS = {"deep": 'b"[" * 100000 + b"\\n"', "forged": """b'{"event":"cells","errors":[[1,2]]}\\n'""",
           "unknown": """(b'{"event":"junk","blob":"' + b"x" * (4 * 2**20) + b'"}\\n') * 32""",
           "long": """b'{"event":"junk","blob":"' + b"y" * (80 * 2**20)""",
           "nan": """b'{"event":"case","index":0}\\n{"event":"data","index":0,"data":[NaN,NaN,NaN]}\\n'"""
                  """ b'{"event":"done"}\\n'"""}


@pytest.mark.slow
def test_hostile_pipes_get_zero_and_the_run_goes_on_and_resumes(tmp_path):
    nb = nbformat.read(TINY, as_version=4)
    keep = {"title", "setup", "double-text", "double-stub", "double-solution", "double-check"}
    nb.cells = [c for c in nb.cells if c.id in keep]
    master = tmp_path / "solutions" / "double-lab.ipynb"
    master.parent.mkdir()
    nbformat.write(nb, master)
    subs = []
    for name, line in [*ATTACKS.items(), ("honest", None)]:
        path = tmp_path / f"{name}.ipynb"
        notebooks.student_copy(master, path)
        s = nbformat.read(path, as_version=4)
        code = "def double(x):\n    return 2 * x\n" if line is None else PIPE.format(line)
        next(c for c in s.cells if c.id == "double-stub").source = code
        nbformat.write(s, path)
        subs.append(path)
    box = [] if not Sandbox("bwrap").available() else ["--sandbox", "none", "--unsafe-no-sandbox"]
    cmd = [sys.executable, "-m", "labkit.notebooks", "grade", *map(str, subs), "--master", str(master),
           "--out", str(tmp_path / "grades"), "--json", "--timeout", "30", *box]
    env_cache = {"XDG_CACHE_HOME": str(tmp_path / "cache")}
    import os
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=600, env={**os.environ, **env_cache})
    rows = {Path(r["submission"]).stem: r for r in map(json.loads, proc.stdout.splitlines())}
    assert set(rows) == {*ATTACKS, "honest"}, proc.stderr[-3000:]
    assert rows["honest"]["points"] == 1, rows["honest"]
    for name in ATTACKS:
        assert rows[name]["points"] == 0, rows[name]
        assert rows[name]["exercises"][0]["status"] in ("error", "fail"), rows[name]
    again = subprocess.run([*cmd, "--resume"], capture_output=True, text=True, cwd=ROOT, timeout=120,
                           env={**os.environ, **env_cache})
    assert again.stdout == "" and again.returncode in (0, 1), again.stderr[-2000:]
    book = json.loads((tmp_path / "grades" / "double-lab.json").read_text())
    assert len(book["submissions"]) == len(subs)

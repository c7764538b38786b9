"""The memory-knobs and debugging labs as Specs, and the grader's knowledge of every lab (issue 23).

* ``recompute-core`` (labkit.check.memory_knobs): the solution passes; a recomputation that draws a
  new mask, one that leaves the generator where the recomputation left it, and one that keeps the
  scores on ``ctx`` each fail with their own message; graded in isolation, a hidden world size
  passes and a call of labkit's own recomputation is banned.
* ``planted-bug``, ``reshard``, ``hang`` (labkit.check.debugging): graded in isolation, the
  student's ``SEED`` is read with the answer and named in the verdict, hidden reshard shapes judge
  the classic contiguous cut, an answer of the wrong type says so.
* ``input`` cells run with the answers (the seed, a tool's run), scoped ones for their exercise
  only; a lab without ``setup`` cells gets its import cells; the runner writes whole lines.
* Every lab of _toc.yml has a master and a student copy, each exercise is a Spec or its lab is
  graded in-process (``registry.IN_PROCESS``), exercise ids are unique across labs, and
  book/instructors.md lists every lab.
* Slow: the memory-knobs lab graded end to end (master: full marks; student copy: 0; an attack: 0).

About 40 s on the 2-core machine, the slow test about 40 s more.
"""
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from labkit.check import debugging, memory_knobs
from labkit.check.registry import IN_PROCESS, all_specs, find
from test_check_isolation import run_all

nbformat = pytest.importorskip("nbformat", reason="the notebook tools (requirements.txt) are not installed")

ROOT = Path(__file__).resolve().parents[1]
MK_SETUP = "import torch\n"
SOLUTION = """
class RecomputeCore(torch.autograd.Function):
    @staticmethod
    def forward(ctx, core, q, k, v):
        gen = core.attention_dropout.generator
        ctx.core, ctx.gen, ctx.state = core, gen, gen.get_state()
        ctx.save_for_backward(q, k, v)
        {hold}
        with torch.no_grad():
            return core(q, k, v)

    @staticmethod
    def backward(ctx, grad):
        q, k, v = (t.detach().requires_grad_() for t in ctx.saved_tensors)
        now = ctx.gen.get_state()
        {restore}ctx.gen.set_state(ctx.state)
        with torch.enable_grad():
            out = ctx.core(q, k, v)
        {put_back}ctx.gen.set_state(now)
        torch.autograd.backward(out, grad)
        return None, q.grad, k.grad, v.grad


def recompute(core, q, k, v):
    return RecomputeCore.apply(core, q, k, v)
"""


def _recompute(hold="pass", restore="", put_back=""):
    ns = {"torch": __import__("torch")}
    exec(SOLUTION.format(hold=hold, restore=restore, put_back=put_back), ns)  # noqa: S102 - the test's own source
    return ns["recompute"]


def test_recompute_core_judges_the_mask_the_generator_and_what_is_kept():
    assert memory_knobs.recompute_core(_recompute())
    for variant, words in ((dict(restore="pass  # "), "gradient"),
                           (dict(put_back="pass  # "), "generator's state after the step"),
                           (dict(hold="ctx.scores = torch.zeros(q.shape[0], q.shape[1], q.shape[2], q.shape[2])"),
                            "held (on ctx")):
        r = memory_knobs.recompute_core(_recompute(**variant))
        assert not r and words in r.message, (variant, r.line())


def test_recompute_core_graded_in_isolation_hidden_world_size_and_its_ban():
    banned = "from labkit.recompute import checkpoint\n\ndef recompute(core, q, k, v):\n" \
             "    return checkpoint(core, [core.attention_dropout.generator], q, k, v)\n"
    hidden = {"world_size": 1, "seed": 5, "p": 0.1, "seq_length": 6}
    honest, attack = run_all([("recompute-core", SOLUTION.format(hold="pass", restore="", put_back=""), MK_SETUP,
                               [{"world_size": 2, "p": 0.2}, hidden]),
                              ("recompute-core", banned, MK_SETUP)])
    assert all(r.passed for r in honest), [r.line() for r in honest]
    assert not attack[0].passed and "labkit's own implementation" in attack[0].message, attack[0].line()


def test_debugging_specs_read_the_seed_and_judge_hidden_shapes():
    from labkit.debug.bugs import assigned_bug
    want = assigned_bug(3).expect
    scenario, culprit = debugging.hang_assignment(5)
    waits = {culprit: "barrier", 1 - culprit: debugging.WAITS[scenario]}
    right = ("def reshard_tp2_to_tp4(shards, ffn):\n    out = [{} for _ in range(4)]\n"
             "    for key in shards[0]:\n        gate = torch.cat([s[key][:ffn // 2] for s in shards])\n"
             "        up = torch.cat([s[key][ffn // 2:] for s in shards])\n        n = ffn // 4\n"
             "        for r in range(4):\n            out[r][key] = torch.cat([gate[r*n:(r+1)*n], up[r*n:(r+1)*n]])\n"
             "    return out\n")
    contiguous = ("def reshard_tp2_to_tp4(shards, ffn):\n    return [{k: torch.cat([torch.cat([s[k][:ffn // 2] for s in "
                  "shards]), torch.cat([s[k][ffn // 2:] for s in shards])]).chunk(4)[r] for k in shards[0]} "
                  "for r in range(4)]\n")
    hidden = json.loads((ROOT / "solutions" / "hidden" / "when-training-goes-wrong-lab.json").read_text())["reshard"]
    setup = "import torch\n"
    bug, wrong_type, hang, ok, bad = run_all([
        ("planted-bug", f"SEED = 3\nanswer = {{'layer': {want['layer']!r}, 'collective': {want['collective']!r}}}", setup),
        ("planted-bug", "SEED = 3\nanswer = ['decoder.layers.0']", setup),
        ("hang", f"SEED = 5\ndiagnosis = {{'waits': {waits!r}, 'culprit': {culprit}}}", setup),
        ("reshard", right, setup, hidden), ("reshard", contiguous, setup, hidden)])
    assert bug[0].passed and "seed 3" in bug[0].message, bug[0].line()
    assert not wrong_type[0].passed and "answer is a list, not a dict" in wrong_type[0].message
    assert hang[0].passed and "seed 5" in hang[0].message, hang[0].line()
    assert all(r.passed for r in ok), [r.line() for r in ok]
    assert not any(r.passed for r in bad) and "contiguous blocks" in bad[0].hint, bad[0].line()


def test_input_cells_run_with_the_answers_scoped_ones_for_their_exercise_only():
    from labkit.notebooks.answers import jobs
    master = nbformat.read(ROOT / "solutions" / "when-training-goes-wrong-lab.ipynb", as_version=4)
    sub = nbformat.read(ROOT / "labs" / "when-training-goes-wrong-lab.ipynb", as_version=4)
    by_id = {j.exercise.id: "\n".join(src for _, src in j.answers) for j in jobs(master, sub)}
    assert all("SEED = 7" in text for text in by_id.values())                       # unscoped: every job
    assert "first_divergence(**job)" in by_id["planted-bug"]                         # scoped to planted-bug
    assert "first_divergence(**job)" not in by_id["hang"] + by_id["reshard"]
    assert "run_assigned_hang(SEED)" in by_id["hang"] and "run_assigned_hang" not in by_id["planted-bug"]
    assert all(j.setup and "from labkit.check import debugging as check" in j.setup[0] for j in jobs(master, sub))


def test_a_lab_without_setup_cells_gets_its_import_cells():
    from labkit.notebooks.answers import setup_sources
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("import torch\nfrom labkit.check import native as check"),
                nbformat.v4.new_code_cell("x = 1\nimport torch"),
                nbformat.v4.new_code_cell("def f():\n    raise NotImplementedError", metadata={"labkit": {
                    "exercise": "e", "role": "stub"}})]
    assert setup_sources(nb) == ["import torch\nfrom labkit.check import native as check"]
    nb.cells[1].metadata["labkit"] = {"role": "setup"}
    assert setup_sources(nb) == ["x = 1\nimport torch"]                               # marked cells win


def test_the_runner_writes_whole_lines_when_a_write_is_cut_short(monkeypatch):
    from labkit.check import runner
    r, w = os.pipe()
    chan = runner.Channel.__new__(runner.Channel)
    chan.fd = w
    real = os.write
    monkeypatch.setattr(runner.os, "write", lambda fd, data: real(fd, bytes(data[:1000])))   # a signal's cut
    data = b'{"event":"data","data":"' + b"x" * 300_000 + b'"}\n'
    got = []
    reader = threading.Thread(target=lambda: got.append(b"".join(iter(lambda: os.read(r, 1 << 16), b""))))
    reader.start()
    chan.write(data)
    os.close(w)
    reader.join(10)
    os.close(r)
    assert got == [data]


def _toc_labs():
    return [line.split("labs/")[1].strip() for line in (ROOT / "_toc.yml").read_text().splitlines()
            if line.strip().startswith("- file: labs/")]


def test_every_lab_of_the_book_is_known_to_the_grader_and_listed_for_instructors():
    from labkit.notebooks.schema import exercises
    labs, seen = _toc_labs(), {}
    guide = (ROOT / "book" / "instructors.md").read_text()
    assert len(labs) >= 12
    specs = all_specs()
    for lab in labs:
        master = ROOT / "solutions" / f"{lab}.ipynb"
        assert master.exists() and (ROOT / "labs" / f"{lab}.ipynb").exists(), lab
        assert f"../labs/{lab}.ipynb" in guide, f"book/instructors.md does not list {lab}"
        for ex in exercises(nbformat.read(master, as_version=4)):
            assert ex.id not in seen, f"exercise id {ex.id!r} in {lab} and {seen[ex.id]}"
            seen[ex.id] = lab
            assert (find(ex.id) is not None) != (lab in IN_PROCESS), f"{lab}: {ex.id} is neither a Spec nor in-process"
    assert set(IN_PROCESS) <= set(labs)
    assert set(specs) - set(seen) <= {"double", "mean", "shout"}                    # only the fixture's own


@pytest.mark.slow
def test_memory_knobs_lab_graded_master_full_student_zero_attack_zero(tmp_path):
    from grading_e2e import grade_master_student_attack
    attack = ("import types\nimport labkit.check.memory_knobs as mk\nfrom labkit.recompute import checkpoint\n"
              "mk._judge = lambda data, **case: mk.report('recompute_core', True, 'trust me')\n"
              "check = types.SimpleNamespace(recompute_core=lambda f: print('[check] PASS recompute_core: trust me'))\n"
              "def recompute(core, q, k, v):\n"
              "    return checkpoint(core, [core.attention_dropout.generator], q, k, v)\n")
    solved, student, attack = grade_master_student_attack(
        ROOT / "solutions" / "memory-knobs-lab.ipynb", tmp_path, lambda m: m.get("role") == "stub", attack, 600)
    assert (solved["points"], solved["max_points"]) == (4, 4), solved
    assert len(solved["exercises"][0]["cases"]) == 3 and solved["exercises"][0]["checked"] == "isolated"
    assert student["points"] == 0 and "not written yet" in student["exercises"][0]["message"]
    assert attack["points"] == 0 and "trust me" not in json.dumps(attack)
    assert "labkit's own implementation" in attack["exercises"][0]["message"]

"""The lab exercise ``resume-after-kill`` (labkit.check.resume, issue 37): the student's
checkpoint functions are used by a run that is SIGKILLed and resumed in a new process.

The master's answer passes; a checkpoint without the RNG states, one of the weights only, and one
whose load returns the wrong iteration each fail naming what is missing; graded in isolation (the
grader's runner), a hidden case (another interval, kill point and seed) passes the same answer.
"""
import pytest

from labkit.check import resume
from test_check_isolation import isolated

SOLUTION = '''
import os, torch
def save_checkpoint(path, iteration, model, optimizer, data_gen):
    state = {"iteration": iteration, "model": model.state_dict(), "optimizer": optimizer.state_dict(),
             "dropout_rng": torch.get_rng_state(), "data_rng": data_gen.get_state()}
    torch.save(state, path + ".partial")
    os.replace(path + ".partial", path)
def load_checkpoint(path, model, optimizer, data_gen):
    state = torch.load(path)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    RNG
    data_gen.set_state(state["data_rng"])
    return state["iteration"]OFF
'''
RNG = 'torch.set_rng_state(state["dropout_rng"])'


def test_the_reference_loop_is_deterministic_and_uses_both_streams():
    a, b = resume.train_loop(6, 0, stop_at=3), resume.train_loop(6, 0, stop_at=3)
    import torch
    assert a["losses"] == b["losses"] and all(torch.equal(a["final"][p], b["final"][p]) for p in resume.PARTS)
    assert not torch.equal(a["at"]["dropout_rng"], a["final"]["dropout_rng"])     # dropout draws
    assert not torch.equal(a["at"]["data_rng"], a["final"]["data_rng"])           # the batches draw
    assert resume.train_loop(6, 1)["losses"] != a["losses"]


@pytest.mark.slow
def test_the_answer_passes_and_each_mistake_is_named():
    ok = resume.resume_after_kill(*_fns(_answer(RNG, "")))
    no_rng = resume.resume_after_kill(*_fns(_answer("pass", "")))
    off = resume.resume_after_kill(*_fns(_answer(RNG, " + 1")))
    assert ok.passed, ok.message
    assert not no_rng.passed and "torch.get_rng_state()" in no_rng.message
    assert not off.passed and "returned 4" in off.message


@pytest.mark.slow
def test_graded_in_isolation_on_a_hidden_case():
    hidden = {"steps": 10, "save_interval": 4, "kill_at": 7, "seed": 3}
    ok, = isolated("resume-after-kill", _answer(RNG, ""), "import torch\n", [hidden], timeout=240)
    model_only = '''
import torch
def save_checkpoint(path, iteration, model, optimizer, data_gen):
    torch.save({"iteration": iteration, "model": model.state_dict()}, path)
def load_checkpoint(path, model, optimizer, data_gen):
    state = torch.load(path)
    model.load_state_dict(state["model"])
    return state["iteration"]
'''
    bad, = isolated("resume-after-kill", model_only, "import torch\n", [hidden], timeout=240)
    assert ok.passed, ok.message
    assert not bad.passed and "first moments" in bad.message


def _fns(src):
    ns = {}
    exec(src, ns)   # noqa: S102 - the test's own answer
    return ns["save_checkpoint"], ns["load_checkpoint"]


def _answer(rng: str, off: str) -> str:
    return SOLUTION.replace("RNG\n", rng + "\n").replace("OFF", off)

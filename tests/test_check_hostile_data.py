"""No judge passes data that is not an honest answer (issue 33, "NaN passes").

Every Spec of every lab, enumerated from the registry (a new exercise is covered the day it is
registered), through ``Spec.verdict`` (what the grader and the notebook call):

* whole answers that are no answer: NaN, inf, -inf, -0.0, a huge int, True, a float subclass whose
  ``__eq__``/``__sub__``/``__abs__`` lie, an int subclass, empty containers, a string;
* the honest answer of each visible case (what the lab's master produces, recorded by
  ``python tests/honest_data.py`` in tests/fixtures/honest-data.json) must still pass, which keeps
  the record honest; then each number in it replaced in turn (first, middle and last few of each
  answer) by NaN, inf, -inf, a lying float, a huge int, and each int by a bool, by the same value as
  a float (-0.0 for 0) and an int subclass: each must fail, where the verdict reads that number
  (one that still passes when made plainly wrong, value * 3 + 7, is a field no verdict reads, such as
  a call count, and is left alone). Answers larger than the record's size limit (a few tensor-heavy
  exercises) keep only their whole-answer and tensor mutations (a NaN in each tensor).

A judge that raises on such data counts as failing (the grader reports "the check could not read
what your code produced", 0 points); one that passes any of them is the bug this test exists for.
"""
import json
import math
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from labkit.check.registry import all_specs

FIXTURE = Path(__file__).parent / "fixtures" / "honest-data.json"
SPECS = all_specs()


class LyingFloat(float):
    def __eq__(self, other):
        return True

    def __ne__(self, other):
        return False

    def __sub__(self, other):
        return 0.0

    def __rsub__(self, other):
        return 0.0

    def __abs__(self):
        return 0.0

    def __lt__(self, other):
        return True

    def __le__(self, other):
        return True

    def __gt__(self, other):
        return False

    def __ge__(self, other):
        return False

    __hash__ = float.__hash__


class LyingInt(int):
    def __eq__(self, other):
        return True

    def __ne__(self, other):
        return False

    __hash__ = int.__hash__


WHOLE = [float("nan"), float("inf"), float("-inf"), -0.0, 10**100, True, LyingFloat(1.0), LyingInt(2), [], {}, "x",
         [float("nan")] * 4, {"value": float("nan")}, {"value": LyingFloat(0.5)}]


def _passes(spec, data, case) -> bool:
    try:
        return bool(spec.verdict(data, **case).passed)
    except Exception:  # noqa: BLE001 - the grader turns a judge's exception into a failed case
        return False


def _honest():
    if not FIXTURE.exists():
        return {}
    from labkit.check import wire
    return {k: [wire.decode(d) if d is not None else None for d in v] for k, v in json.loads(FIXTURE.read_text()).items()}


HONEST = _honest()
LARGE = {"blockwise-dequantize", "blockwise-quantize", "bucket-hook", "fsdp-tp-mesh", "one-f-one-b-loop", "tp-plan",
         "zero1-step", "zero2-hook"}


def _leaves(data, path=()):
    """(path, value) of every number and tensor in ``data``."""
    if type(data) is dict:
        for k, v in data.items():
            yield from _leaves(v, path + (k,))
    elif type(data) is list:
        for i, v in enumerate(data):
            yield from _leaves(v, path + (i,))
    elif type(data) in (int, float) or isinstance(data, torch.Tensor):
        yield path, data


def _set(data, path, value):
    if not path:
        return value
    out = dict(data) if type(data) is dict else list(data)
    out[path[0]] = _set(data[path[0]], path[1:], value)
    return out


def _mutations(value):
    if isinstance(value, torch.Tensor):
        if value.is_floating_point() and value.numel():
            bad = value.clone()
            bad.view(-1)[0] = float("nan")
            return [bad]
        return []
    if type(value) is float:
        return [float("nan"), float("inf"), float("-inf"), LyingFloat(value + 1.0), 10**100]
    return [True if value != 1 else False, float(value) if value else -0.0, LyingInt(value + 1), 10**100,
            float("nan")]


@pytest.mark.parametrize("spec_id", sorted(SPECS))
def test_no_judge_passes_an_answer_that_is_no_answer(spec_id):
    spec = SPECS[spec_id]
    for case in spec.cases:
        for value in WHOLE:
            assert not _passes(spec, value, dict(case)), f"{spec_id} passed {value!r} for {case}"


@pytest.mark.slow
@pytest.mark.skipif(not HONEST, reason="no tests/fixtures/honest-data.json (python tests/honest_data.py)")
@pytest.mark.parametrize("spec_id", sorted(SPECS))
def test_each_number_of_an_honest_answer_made_hostile_fails(spec_id):
    spec = SPECS[spec_id]
    if spec_id in LARGE:
        pytest.skip("its honest answer is larger than the record keeps: the whole-answer and gate tests cover it")
    assert spec_id in HONEST, f"{spec_id} has no honest record: run python tests/honest_data.py {spec_id}"
    for case, data in zip(spec.cases, HONEST[spec_id]):
        assert _passes(spec, data, dict(case)), f"the master's answer to {spec_id} {case} no longer passes"
        leaves = list(_leaves(data))
        picked = leaves if len(leaves) <= 12 else leaves[:4] + leaves[len(leaves) // 2:len(leaves) // 2 + 2] + leaves[-4:]
        for path, value in picked:
            if not isinstance(value, torch.Tensor) and _passes(spec, _set(data, path, value * 3 + 7), dict(case)):
                continue                  # a field no verdict reads (a call count): what it holds is not judged
            for bad in _mutations(value):
                if type(bad) is type(value) and not isinstance(bad, torch.Tensor) and bad == value:
                    continue
                hostile = _set(data, path, bad)
                assert not _passes(spec, hostile, dict(case)), \
                    f"{spec_id} {case}: {'/'.join(map(str, path))} = {value!r} replaced by {bad!r} passes"


def test_the_gate_refuses_subclasses_huge_ints_and_nonfinite_tensors():
    from labkit.check.compare import close, far, number, refuse
    assert refuse({"a": [1, 2.5, "x", None, True, torch.ones(3)]}) == ""
    for bad in (LyingFloat(1.0), LyingInt(1), 2**60, float("nan"), [float("inf")], torch.tensor([1.0, math.nan]),
                {1: 2}, torch.nn.Parameter(torch.ones(1))):
        assert refuse(bad), bad
    assert number(True) is None and number(LyingFloat(1.0)) is None and number(float("-inf")) is None
    assert far(float("nan"), 0.0, 1e9) and far(LyingFloat(3.0), 3.0, 1.0) and not close("3", 3, 1)
    assert close(3, 3.0, 0.0) and number(-0.0) == 0.0

"""The roofline lab: a GEMM's arithmetic intensity, an op's bound and time, the DP and TP crossovers
as Specs graded against labkit.calc.roofline with hidden cases.

* The master's solutions (read from solutions/roofline-lab.ipynb, so the master is what is tested)
  pass every visible and hidden case.
* A planted wrong answer of each exercise fails with the message a student needs: a multiply-add
  counted as one FLOP, C never written, bytes_per_element left out; the two times summed or the
  smaller one taken, the bound inverted or always "compute"; a ring all-reduce's (n-1)/n forgotten,
  forward FLOPs only, two all-reduces instead of four, a TP rank's FLOPs not divided by t.
* The visible cases can tell: each exercise's cases hold both bounds, and a case whose answer would
  survive a plausible slip is not the only one (FP8 and fp32 elements are hidden cases).
* Graded as the grader does (a fresh runner process, the judge here): a hidden case passes, and an
  answer that calls labkit's own function is refused.
Under 10 s on the 2-core machine, besides the slow end-to-end grading (the grading slice).
"""
import json
from pathlib import Path

import pytest

from labkit.check import roofline as check
from labkit.check.registry import find
from lab_master import LabMaster
from test_check_isolation import run_all

nbformat = pytest.importorskip("nbformat", reason="the notebook tools (requirements.txt) are not installed")

ROOT = Path(__file__).resolve().parents[1]
MASTER = ROOT / "solutions" / "roofline-lab.ipynb"
HIDDEN = ROOT / "solutions" / "hidden" / "roofline-lab.json"
SETUP = "import labkit.calc as calc\nfrom labkit.calc import roofline as rl\n"
ROLES = {"gemm-intensity": ("intensity", "arithmetic_intensity"), "roofline-bound": ("bound", "roofline_bound"),
         "comm-crossover": ("crossover", "comm_crossover")}


LAB = LabMaster(MASTER, HIDDEN, SETUP, ROLES)
_solutions, _fn, _cases, _verdicts = LAB.solutions, LAB.fn, LAB.cases, LAB.verdicts


@pytest.mark.parametrize("exercise", sorted(ROLES))
def test_the_masters_solution_passes_every_visible_and_hidden_case(exercise):
    fn = _fn(_solutions()[exercise], ROLES[exercise][1])
    results = _verdicts(exercise, fn)
    assert len(results) >= 4 and all(results), [r.line() for r in results if not r]


I, B, X = "gemm-intensity", "roofline-bound", "comm-crossover"
# (edits of the master's solution, the case it fails (index into visible + hidden; None: all),
#  words of the message, words of the hint)
PLANTS = {
    I: [((("2 * M * N * K", "M * N * K"),), 0, "[4096, 4096] x [4096, 4096]", "2MNK, not MNK"),
        ((("K * N + M * N)", "K * N)"),), 0, "FLOPs per byte, expected", "C is written once"),
        ((("bytes_per_element * (M", "(M"),), 0, "expected 1365.33", "times bytes_per_element"),
        ((("return flops / moved", "return moved / flops"),), 0, "expected", "FLOPs over bytes")],
    B: [((("max(flops", "min(flops"),), 0, "qkv (", "not min"),
        ((("max(flops / peak_flops, bytes_moved / bandwidth)", "flops / peak_flops + bytes_moved / bandwidth"),),
         0, "qkv (", "not their sum"),
        ((("bytes_moved >= peak_flops", "bytes_moved < peak_flops"),), 0, "bound 'memory', expected 'compute'",
         "right of the ridge"),
        ((('if flops / bytes_moved >= peak_flops / bandwidth else "memory"', ""),), 0, "norm (", "left of it"),
        ((('"compute" if', '"Compute" if'),), 0, "bound 'Compute'", "'compute' or 'memory'")],
    X: [((("ring = 2 * (n - 1) / n", "ring = 2"),), 0, "tokens per GPU per step", "not 2 times it"),
        ((("ring = 2 * (n - 1) / n", "ring = 2"),), 1, "hidden size h", "2 (t-1)/t"),
        ((("ring * e * R / 6", "ring * e * R / 2"),), 0, "expected 11,538.3", "6 FLOPs per weight"),
        ((("4 * ring * e", "2 * ring * e"),), 1, "expected 3,418.77", "four all-reduces"),
        ((("* n / 72", "/ 72"),), 1, "hidden size h", "1/t of the layer's FLOPs"),
        ((("* n / 72", "* n / 24"),), 1, "hidden size h", "backward's FLOPs")],
}


@pytest.mark.parametrize("exercise,plant", [(e, k) for e in PLANTS for k in range(len(PLANTS[e]))],
                         ids=lambda v: str(v))
def test_a_planted_wrong_answer_fails_with_an_actionable_message(exercise, plant):
    LAB.check_plant(exercise, *PLANTS[exercise][plant])


def test_the_visible_cases_hold_both_bounds_and_the_hidden_ones_other_element_sizes():
    """A bound that is always "compute" or always "memory" fails a visible case on a GEMM or the
    attention, not only on the norm; the element size left out passes every bf16 case (2 / 2) and
    only a hidden FP8 or fp32 case tells."""
    from labkit.calc import roofline as rl
    for case in find(B).cases:
        ops, P, W = check.layer(**case)
        kinds = {o.kind for o in ops if rl.bound(o, P, W) == "memory"}
        assert "elementwise" in kinds
    ops, P, W = check.layer(**find(B).cases[1])
    assert {o.kind for o in ops if rl.bound(o, P, W) == "memory"} & {"gemm", "attention"}
    slip = _fn(_solutions()[I], "arithmetic_intensity", ("2 * M * N * K", "M * N * K"),
               ("bytes_per_element * (M", "(M"))
    assert all(_verdicts(I, slip, list(find(I).cases)))            # 2 / 2: the bf16 cases cannot tell
    assert not all(_verdicts(I, slip))                             # a hidden case can
    for case in json.loads(HIDDEN.read_text())[X]:                 # hidden crossovers: other GPUs, sizes, e
        assert case["cluster"] != "dgx-h100" or case["n"] != 8


def test_graded_in_isolation_a_hidden_case_passes_and_labkits_own_answer_is_refused():
    hidden = json.loads(HIDDEN.read_text())
    sol = _solutions()
    calls_i = "def arithmetic_intensity(M, N, K, bytes_per_element=2):\n" \
              "    return rl.gemm_intensity(M, N, K, bytes_per_element)\n"
    calls_x = "def comm_crossover(axis, n, peak_flops, bandwidth, bytes_per_element=2):\n" \
              "    return rl.crossover(axis, n, peak_flops, bandwidth, bytes_per_element)\n"
    honest_b, honest_x, attack_i, attack_x = run_all([
        (B, sol[B], SETUP, hidden[B][:1]), (X, sol[X], SETUP, hidden[X]), (I, calls_i, SETUP), (X, calls_x, SETUP)])
    assert len(honest_x) == 3 and all(r.passed for r in honest_b + honest_x), [r.line() for r in honest_b + honest_x]
    for r in attack_i + attack_x:
        assert not r.passed and "labkit's own implementation" in r.message, r.line()


def test_an_answer_of_the_wrong_type_is_told_so():
    r = _verdicts(B, lambda f, b, p, w: max(f / p, b / w), _cases(B)[:1])[0]
    assert not r and "(bound, seconds)" in r.message, r.line()
    r = _verdicts(I, lambda M, N, K, bytes_per_element=2: str(M), _cases(I)[:1])[0]
    assert not r and "return a Python float" in r.message, r.line()


@pytest.mark.slow
def test_roofline_lab_graded_master_full_student_zero_attack_zero(tmp_path):
    """End to end, as an instructor grades: the master gets 5 of 5 (every visible and hidden case), the
    student copy 0, and a copy whose stub calls labkit's gemm_intensity and fakes the check 0."""
    from grading_e2e import assert_full_zero_zero, grade_master_student_attack
    attack = ("import types\ncheck = types.SimpleNamespace(gemm_intensity=lambda f: print('[check] PASS x: trust me'))\n"
              "def arithmetic_intensity(M, N, K, bytes_per_element=2):\n"
              "    return rl.gemm_intensity(M, N, K, bytes_per_element)\n")
    solved, student, attack = grade_master_student_attack(
        MASTER, tmp_path, lambda m: m == {"exercise": I, "role": "stub"}, attack)
    assert_full_zero_zero(solved, student, attack, 5, [4, 5, 5])        # visible + hidden cases

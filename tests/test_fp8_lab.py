"""The FP8 lab (issue 32): blockwise quantize/dequantize and delayed scaling's amax update as Specs.

* The master's solutions (read from solutions/fp8-lab.ipynb, so the master is what is tested) pass
  every visible and hidden case, bit for bit against labkit's own recipes.
* A planted wrong answer of each exercise fails with the message a student needs: a tile dropped
  at the ragged edge, the power-of-two rounding forgotten, an all-zero block without Transformer
  Engine's rule, data cast with the scale before its rounding, amax / 448 instead of 1 / (448 / amax),
  the Python float 448.0 / amax (torch computes it as 448 * (1 / amax));
  dividing by scale_inv, a transposed block index; the history rolled the wrong way, the margin
  left out, the amax 0 rule missing, "max" used for "most_recent".
* Graded as the grader does (a fresh runner process, the judge here): a hidden case passes, and an
  answer that calls labkit's quantizer is refused.
* The lab's figure: legible on a phone, deterministic, and it shows what the prose says.
About 25 s on the 2-core machine (the isolated gradings 3-8 s each).
"""
from pathlib import Path

import pytest
import torch

from labkit.check import fp8 as check
from lab_master import LabMaster
from test_check_isolation import run_all

nbformat = pytest.importorskip("nbformat", reason="the notebook tools (requirements.txt) are not installed")

ROOT = Path(__file__).resolve().parents[1]
MASTER = ROOT / "solutions" / "fp8-lab.ipynb"
HIDDEN = ROOT / "solutions" / "hidden" / "fp8-lab.json"
SETUP = "import torch\n\nfrom labkit import fp8\n"


ROLES = {"blockwise-quantize": ("quantize", "blockwise_quantize"),
         "blockwise-dequantize": ("dequantize", "blockwise_dequantize"), "amax-update": ("update", "amax_update")}
LAB = LabMaster(MASTER, HIDDEN, SETUP, ROLES, {"torch": torch})
_solutions, _fn, _cases, _verdicts = LAB.solutions, LAB.fn, LAB.cases, LAB.verdicts


@pytest.mark.parametrize("exercise", sorted(ROLES))
def test_the_masters_solution_passes_every_visible_and_hidden_case(exercise):
    fn = _fn(_solutions()[exercise], ROLES[exercise][1])
    results = _verdicts(exercise, fn)
    assert len(results) >= 4 and all(results), [r.line() for r in results if not r]


Q = "blockwise-quantize"
# (edits of the master's solution, the case it fails (index into visible + hidden; None: all),
#  words of the message, words of the hint)
PLANTS = {
    Q: [((("return data, 1.0 / scale", "return data, (1.0 / scale)[:, : k // bn]"),), 0,
         "scale_inv is (8, 2) torch.float32, expected (8, 3)", "ragged last blocks"),
        ((("    if pow2:", "    if False:"),), 0, "scale_inv", "round the scale DOWN"),
        ((("(amax == 0) | torch.isinf(amax)", "torch.isinf(amax)"),), 0, "block (0, 2): scale_inv", "all-zero block"),
        ((("s = scale.repeat_interleave", "s = (torch.full_like(amax, 448.0) / amax).repeat_interleave"),), 0,
         "element (0, ", "with the block's scale"),
        ((("return data, 1.0 / scale", "return data, torch.where(scale == 1, scale, amax / 448.0)"),), 2,
         "scale_inv", "last bit")],
    "blockwise-dequantize": [
        ((("return data.float() * s", "return data.float() / s"),), None, "element (", "multiply by scale_inv"),
        ((("s = scale_inv.repeat_interleave", "s = scale_inv.flip(1).repeat_interleave"),), 0, "element (",
         "belongs to block")],
    "amax-update": [
        ((("torch.roll(history, 1)", "torch.roll(history, -1)"),), 0, "step 2", "torch.roll(history, 1)"),
        ((("/ 2.0 ** fp8_margin", ""),), 1, "scale", "2**fp8_margin"),
        ((("sf = torch.where(a > 0.0, sf, scale)", "pass"),), 1, "step 2 (amax 0", "keeps the previous scale"),
        ((('if fp8_amax_compute_algo == "max" else history[0]', ""),), 1, "scale", "most recent"),
    ],
}


@pytest.mark.parametrize("exercise,plant", [(e, k) for e in PLANTS for k in range(len(PLANTS[e]))],
                         ids=lambda v: str(v))
def test_a_planted_wrong_answer_fails_with_an_actionable_message(exercise, plant):
    LAB.check_plant(exercise, *PLANTS[exercise][plant])


def test_the_python_float_division_is_caught_where_it_rounds_differently():
    """``448.0 / amax`` (a Python float over a tensor) is computed by torch as 448 * (1 / amax): one
    rounding more. With power-of-two scales it rarely shows; with fp32 scales (hidden case) it does."""
    fn = _fn(_solutions()[Q], "blockwise_quantize", ("torch.full_like(amax, 448.0) / amax", "448.0 / amax"))
    results = _verdicts(Q, fn, [c for c in _cases(Q) if not c["pow2"]])
    failed = [r for r in results if not r]
    assert failed, "448.0 / amax passed every fp32-scale case: the hidden cases no longer tell"
    assert "division of two tensors" in failed[0].hint, failed[0].line()
    fn = _fn(_solutions()["amax-update"], "amax_update", ("torch.full_like(a, fp8_max) / a", "fp8_max / a"))
    failed = [r for r in _verdicts("amax-update", fn) if not r]
    assert failed and "division of two tensors" in failed[0].hint, [r.line() for r in failed]


def test_graded_in_isolation_a_hidden_case_passes_and_labkits_quantizer_is_refused():
    import json
    hidden = json.loads(HIDDEN.read_text())
    sol = _solutions()
    banned = "def blockwise_quantize(x, block, pow2=True):\n    q = fp8.quantize_blockwise(x, fp8.E4M3, block, pow2)\n" \
             "    return q.data, q.scale_inv\n"
    delayed = "def amax_update(history, amax, scale, fp8_amax_history_len, fp8_amax_compute_algo, fp8_margin, " \
              "fp8_max=448.0):\n    s = fp8.DelayedScaling(fp8.E4M3)\n    s.update(amax)\n    return history, s.scale\n"
    honest_q, honest_a, attack_q, attack_a = run_all([
        (Q, sol[Q], SETUP, hidden[Q][1:2]), ("amax-update", sol["amax-update"], SETUP, hidden["amax-update"][:2]),
        (Q, banned, SETUP), ("amax-update", delayed, SETUP)])
    assert all(r.passed for r in honest_q + honest_a), [r.line() for r in honest_q + honest_a]
    for r in attack_q + attack_a:
        assert not r.passed and "labkit's own implementation" in r.message, r.line()


def test_an_answer_of_the_wrong_type_is_told_so():
    r = _verdicts(Q, lambda x, block, pow2=True: (x, torch.ones(1)), _cases(Q)[:1])[0]
    assert not r and "float8_e4m3fn" in r.message, r.line()
    r = _verdicts("amax-update", lambda history, amax, scale, **kw: float(scale), _cases("amax-update")[:1])[0]
    assert not r and "(history, scale)" in r.message, r.line()


def test_the_outlier_figure_is_legible_and_shows_the_outlier_confined_to_its_tile():
    from labkit import fp8
    from labkit.figures import MIN_LABEL_PX, smallest_label_px, svg
    from labkit.figures import fp8 as F
    g = torch.Generator().manual_seed(0)
    x = torch.randn(16, 512, generator=g)
    x[5, 300] = 1e5
    errors = {"tensorwise": F.block_error(x, fp8.quantize_tensorwise(x, fp8.E4M3)),
              "blockwise 1x128": F.block_error(x, fp8.quantize_blockwise(x, fp8.E4M3, (1, 128)))}
    tw, bw = (e.flatten() for e in errors.values())
    tile = 5 * 4 + 300 // 128
    others = torch.ones(64, dtype=torch.bool)
    others[tile] = False
    assert bw[tile] > bw[others].max()                       # blockwise: the outlier's tile is the worst
    assert tw[others].median() > 5 * bw[others].median()     # tensorwise: every tile pays for it
    a, b = svg(F.block_errors(errors, outlier=tile)), svg(F.block_errors(errors, outlier=tile))
    assert a == b and "<text" in a
    assert smallest_label_px(a) >= MIN_LABEL_PX, smallest_label_px(a)


@pytest.mark.slow
def test_fp8_lab_graded_master_full_student_zero_attack_zero(tmp_path):
    """End to end, as an instructor grades: the master gets 7 of 7 (every visible and hidden case), the
    student copy 0, and a copy whose stub calls labkit's quantizer and fakes the check 0."""
    from grading_e2e import assert_full_zero_zero, grade_master_student_attack
    attack = ("import types\ncheck = types.SimpleNamespace(blockwise_quantize=lambda f: print('[check] PASS x: trust me'))\n"
              "def blockwise_quantize(x, block, pow2=True):\n    q = fp8.quantize_blockwise(x, fp8.E4M3, block, pow2)\n"
              "    return q.data, q.scale_inv\n")
    solved, student, attack = grade_master_student_attack(
        MASTER, tmp_path, lambda m: m == {"exercise": Q, "role": "stub"}, attack)
    assert_full_zero_zero(solved, student, attack, 7, [6, 4, 5])        # visible + hidden cases

"""The calculators' shared front-end code: labkit.calc.report (static page) and labkit.widgets."""
import csv
from pathlib import Path

import pytest

import labkit.calc as calc
from labkit.calc import report
from labkit.calc.pipeline import bubble_share_of_step

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("name", sorted(report.FORMS))
def test_default_inputs_give_an_answer_not_an_error(name):
    out = report.calculate(name, {})
    assert 'data-key="error"' not in out and "data-key=" in out


def test_answer_numbers_are_labkit_calc_numbers():
    out = report.calculate("batch", {"model": "gpt3-175b", "world_size": 64, "tensor_model_parallel_size": 4,
                                     "pipeline_model_parallel_size": 4, "micro_batch_size": 2,
                                     "global_batch_size": 256})
    assert '<span data-key="num_microbatches">32</span>' in out
    assert '<span data-key="data_parallel_size">4</span>' in out


@pytest.mark.parametrize("name, values, rule", [
    ("batch", {"tensor_model_parallel_size": 3}, "world_size divisible by TP*PP*CP"),
    ("memory", {"pipeline_model_parallel_size": 5, "world_size": 40}, "num_layers divisible by PP"),
    ("memory", {"world_size": "x"}, "invalid literal"),
    ("planner", {"cluster": "nope"}, "unknown cluster"),
])
def test_invalid_input_shows_the_rule_not_a_traceback(name, values, rule):
    out = report.calculate(name, values)
    assert 'data-key="error"' in out and rule in out.replace("&#x27;", "'")


def test_sp_without_tp_is_shown_as_a_warning():
    out = report.calculate("batch", {"sequence_parallel": True})
    assert "no-op" in out and 'data-key="error"' not in out


def test_widget_recomputes_on_change_and_shows_errors():
    widgets = pytest.importorskip("labkit.widgets")
    box = widgets.memory_widget()
    assert "peak_gib" in box.answer.value
    box.controls["tensor_model_parallel_size"].value = 3
    assert "world_size divisible by TP*PP*CP" in box.answer.value
    box.controls["tensor_model_parallel_size"].value = 8
    assert "peak_gib" in box.answer.value
    with pytest.raises(ValueError, match="no inputs"):
        widgets.calculator("batch", bogus=1)


def test_narayanan_table_is_self_consistent():
    rows = list(csv.DictReader(open(ROOT / "data" / "narayanan2021_table1.csv")))
    assert len(rows) == 10
    for r in rows:
        tp, pp, dp, mp, gpus = (int(r[k]) for k in ("tensor_model_parallel_size", "pipeline_model_parallel_size",
                                "data_parallel_size", "model_parallel_size", "num_gpus"))
        assert tp * pp == mp and mp * dp == gpus
        tflops = float(r["tflops_per_gpu"])
        assert abs(tflops / 312 * 100 - float(r["percent_of_peak"])) <= 1.0     # % of A100 peak
        assert tflops * gpus / 1000 == pytest.approx(float(r["aggregate_pflops"]), rel=0.01)
        m = calc.model("megatron-" + r["model"].lower())
        assert (m.num_attention_heads, m.hidden_size, m.num_layers) == (
            int(r["num_attention_heads"]), int(r["hidden_size"]), int(r["num_layers"]))


@pytest.mark.parametrize("name", ["batch", "memory"])
def test_bubble_is_shown_beside_its_share_of_the_step(name):
    # p = 8, m = 1: the bubble is 7x the compute (700%), which reads as nonsense alone; beside it the
    # share of the step, (p-1)/(m+p-1) = 7/8 (issue 36, defect 7).
    out = report.calculate(name, {"model": "gpt2-1.5b", "world_size": 8, "tensor_model_parallel_size": 1,
                                  "pipeline_model_parallel_size": 8, "micro_batch_size": 1,
                                  "global_batch_size": 1})
    assert 'data-key="error"' not in out, out
    assert '<span data-key="bubble">7.0000</span> of the compute time' in out
    assert f'<span data-key="bubble_share">{7 / 8:.1%}</span> of the step' in out
    assert bubble_share_of_step(8, 1) == 7 / (1 + 8 - 1)


def test_negative_step_time_is_an_error_not_ignored():
    assert "step_time must be a positive" in report.calculate("memory", {"step_time": -1})
    assert 'data-key="mfu"' in report.calculate("memory", {"step_time": 10})
    assert 'data-key="mfu"' not in report.calculate("memory", {"step_time": 0})

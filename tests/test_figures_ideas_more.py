"""The idea diagrams of low-precision, three-implementations and fuzzing (issue 36) are drawn from labkit's objects and data, not typed:
change the input and the picture changes; feed them an inconsistent input and they refuse."""
import copy

import matplotlib
import pytest

matplotlib.use("Agg")

from labkit.figures import svg                                    # noqa: E402


def _text(fig) -> str:
    import matplotlib.pyplot as plt
    out = svg(fig)
    plt.close(fig)
    return out


def test_formats_are_finfo_and_agree_with_the_drift_table():
    from labkit.figures.low_precision import formats
    rows = {r["name"]: r for r in formats()}
    assert rows["fp32"]["bits"] == (1, 8, 23) and rows["bf16"]["bits"] == (1, 8, 7)
    assert rows["fp16"]["bits"] == (1, 5, 10) and rows["fp8 E4M3"]["bits"] == (1, 4, 3)
    assert rows["fp8 E5M2"]["bits"] == (1, 5, 2) and rows["fp8 E4M3"]["max"] == 448.0
    assert [r["u"] for r in rows.values()] == [2.0 ** -24, 2.0 ** -8, 2.0 ** -11, 2.0 ** -4, 2.0 ** -3]


def test_three_implementations_reads_the_record():
    from labkit.figures.three_implementations import fig_three_implementations, record
    rec = record()
    worse = copy.deepcopy(rec)
    worse["DP2"]["megatron"]["grad_diff"] = 3e-9
    assert "within 1e-16" in _text(fig_three_implementations(rec))
    assert "within 3e-09" in _text(fig_three_implementations(worse))
    with pytest.raises(ValueError, match="not the chapter's"):
        fig_three_implementations({"TP4": rec["DP2"]})


def test_fuzz_loop_counts_are_the_budgets():
    from labkit.figures.fuzzing import budgets, fig_fuzz_loop, per_bug
    data = budgets()
    bugs = per_bug(data)
    assert len(bugs) == 6 and all(b["seeds"] == 5 for b in bugs)
    drawn = sum(r["drawn"] for r in data["runs"].values())
    refused = drawn - sum(r["run"] for r in data["runs"].values())
    assert f"{refused:,} of {drawn:,}" in _text(fig_fuzz_loop(data))
    fewer = copy.deepcopy(data)
    for key in [k for k in fewer["runs"] if k.startswith("vocab_loss_gathered_logits/")]:
        fewer["runs"][key]["found_at"] = None
    assert "0 of 5 seeds" in _text(fig_fuzz_loop(fewer))

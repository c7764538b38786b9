"""The idea diagrams of issue 36 ("an idea diagram in every chapter that has none") are drawn from
labkit's objects and data, not typed. Three say what labkit.calc says: which knob shrinks which part
of a GPU's memory (why-parallelism), what each recompute mode keeps of a layer (memory-knobs,
itemized tensors equal to calc's count), the planner's counts (planning). Three follow their inputs
(low-precision's formats from torch.finfo, three-implementations' record, fuzzing's budgets): change
the input and the picture changes; an inconsistent input is refused."""
import copy

import matplotlib
import pytest

matplotlib.use("Agg")

import labkit.calc as calc                                        # noqa: E402
from labkit import figures                                        # noqa: E402
from labkit.figures import memory_knobs as MK                     # noqa: E402
from labkit.figures import planning as P                          # noqa: E402
from labkit.figures import why_parallelism as W                   # noqa: E402


def _text(fig) -> str:
    import matplotlib.pyplot as plt
    out = figures.svg(fig)
    plt.close(fig)
    return out


def test_memory_cuts_as_the_chapter_states_them():
    cuts = W.memory_cuts("gpt2-774m", 8)
    assert cuts["params"] == ["TP", "PP", "EP (MoE)", "ZeRO-3"]
    assert cuts["grads"] == ["TP", "PP", "EP (MoE)", "ZeRO-2"]
    assert cuts["optimizer"] == ["TP", "PP", "EP (MoE)", "ZeRO-1"]
    # PP keeps the first stage's activations (p microbatches of L/p layers); DP shrinks nothing
    assert cuts["activations"] == ["TP", "SP", "CP", "full recompute"]
    assert cuts["none"] == ["DP"]


def test_recompute_itemization_is_calcs_count_and_a_dropped_tensor_is_caught(monkeypatch):
    svg = figures.svg(MK.fig_recompute("gpt3-175b", 1))
    m = calc.model("gpt3-175b")
    for rec in (None, "selective", "full"):
        gib = calc.layer_activation_bytes(m, calc.ParallelConfig(recompute_granularity=rec), attention="math") / 2**30
        assert f"{gib:.2f}" in svg
    full = MK.layer_tensors
    monkeypatch.setattr(MK, "layer_tensors", lambda *a: full(*a)[:-1])     # forget the MLP dropout mask
    with pytest.raises(ValueError, match="not labkit.calc's"):
        MK.fig_recompute("gpt3-175b", 1)


def test_plan_flow_draws_the_planners_counts():
    c = calc.CLUSTERS["dgx-a100"].with_(nodes=8)
    result = calc.plan(calc.model("megatron-7.5b"), c, 512, micro_batch_sizes=(1, 2), recompute=("full",))
    svg = figures.svg(P.fig_plan_flow("megatron-7.5b", "dgx-a100", 8, 512, (1, 2), ("full",)))
    n = len(result["ranked"]) + result["too_big"] + result["invalid"]
    assert f"candidate_layouts: {n:,}" in svg and f"step_time of {len(result['ranked']):,} layouts" in svg
    assert f"{result['too_big']:,} do not fit" in svg and f"{result['invalid']:,} break a rule" in svg
    assert f"{result['ranked'][0]['tokens_per_s']:,.0f} tokens/s" in svg


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

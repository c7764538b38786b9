"""The idea diagrams of issue 36 ("an idea diagram in every chapter that has none") say what
labkit.calc says: which knob shrinks which part of a GPU's memory (why-parallelism), what each
recompute mode keeps of a layer (memory-knobs, itemized tensors equal to calc's count), and the
planner's counts (planning)."""
import pytest

import labkit.calc as calc
from labkit import figures
from labkit.figures import memory_knobs as MK
from labkit.figures import planning as P
from labkit.figures import why_parallelism as W

pytest.importorskip("matplotlib")


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

"""Tier 1: labkit.calc counts attention memory under ONE explicit kernel for every layout (issue 24,
row 1). GPT-2 XL at 32K tokens on one 8-GPU H100 node: with flash attention (Megatron-Core's
default) and full recompute plain 8-way DP fits; only the "math" kernel (materialized s x s scores)
makes CP look necessary. The expected bytes are derived here by hand, term by term."""
import json

import pytest

from labkit import calc
from labkit.calc import cli

GIB = 2 ** 30
XL = calc.ModelConfig(num_layers=48, hidden_size=1600, num_attention_heads=25, seq_length=32768,
                      vocab_size=50257)


def hand_bytes(distributed_optimizer: bool, attention: str) -> float:
    """TP1 PP1 CP1 DP8, micro batch 1, full recompute, bf16 weights + fp32 grads and Adam (18 B)."""
    L, h, a, s, V, f = 48, 1600, 25, 32768, 50304, 4 * 1600      # vocabulary padded to 128
    n = L * (12 * h * h + 13 * h) + (V + s) * h + 2 * h            # layers, embeddings, final norm
    optimizer = 12 * -(-n // 8) if distributed_optimizer else 12 * n
    inputs = L * s * h * 2 + s * h                                 # layer inputs; embedding dropout mask
    head = s * (2 * h * 2 + 4 * V)                                 # final norm in/out; fp32 log-softmax
    # the one layer recomputed in full: norm/qkv/fc1 inputs (4h) + 2 dropout masks, Q K V + proj
    # input (4h), gelu and fc2 inputs (2f), and the attention the kernel keeps
    layer = 4 * h * 2 + 2 * h + (4 * h + 2 * f) * 2
    layer += h * 2 + a * 4 if attention == "flash" else a * s * (2 * 2 + 1)  # out + lse | scores
    return 2 * n + 4 * n + optimizer + inputs + head + s * layer


def par(**kw):
    return calc.ParallelConfig(8, micro_batch_size=1, global_batch_size=8, recompute_granularity="full", **kw)


@pytest.mark.parametrize("attention, dist_opt, gib", [("flash", False, 39.8), ("flash", True, 24.1),
                                                      ("math", False, 164.7)])
def test_gpt2_xl_32k_dp8_full_recompute(attention, dist_opt, gib):
    (row,) = calc.memory_per_stage(XL, par(use_distributed_optimizer=dist_opt), calc.MIXED_18,
                                   attention=attention)
    assert row["total"] == pytest.approx(hand_bytes(dist_opt, attention), rel=1e-12)
    assert round(row["total"] / GIB, 1) == gib


def test_flash_is_the_default_everywhere():
    p = par()
    assert calc.memory_per_stage(XL, p) == calc.memory_per_stage(XL, p, attention="flash")
    assert calc.peak_memory(XL, p) == calc.peak_memory(XL, p, attention="flash")
    assert calc.layer_activation_bytes(XL, p) == calc.layer_activation_bytes(XL, p, attention="flash")
    assert calc.plan(XL, calc.cluster("dgx-h100"), 8)["attention"] == "flash"


def test_unknown_kernel_is_refused_by_name():
    for fn in (lambda: calc.memory_per_stage(XL, par(), attention="sdpa"),
               lambda: calc.plan(XL, calc.cluster("dgx-h100"), 8, attention="sdpa")):
        with pytest.raises(ValueError, match=r"attention must be one of \('flash', 'math'\).*'sdpa'"):
            fn()


@pytest.mark.parametrize("attention", ["flash", "math"])
def test_planner_costs_every_layout_with_the_one_kernel(attention):
    result = calc.plan(XL, calc.cluster("dgx-h100"), 8, context_parallel_sizes=(1, 2, 4, 8),
                       attention=attention)
    assert result["attention"] == attention and {r["cp"] for r in result["ranked"]} > {2}
    for r in result["ranked"]:                      # CP 1 and CP > 1 alike
        assert r["peak_memory_gib"] * GIB == calc.peak_memory(XL, r["parallel"], attention=attention)
    assert f"(memory with {attention} attention)" in calc.explain(result, calc.cluster("dgx-h100"))[0]


def test_at_32k_cp_is_not_needed_to_fit_with_flash():
    no_cp = calc.plan(XL, calc.cluster("dgx-h100"), 8, context_parallel_sizes=(1,))
    assert no_cp["ranked"], "flash attention: some CP 1 layout fits"
    assert not calc.plan(XL, calc.cluster("dgx-h100"), 8, context_parallel_sizes=(1,), attention="math")["ranked"]
    best = calc.plan(XL, calc.cluster("dgx-h100"), 8, context_parallel_sizes=(1, 2, 4, 8))["ranked"][0]
    assert best["cp"] > 1 and best["recompute"] == "none"  # CP buys speed: no recomputed forward
    assert best["tokens_per_s"] > no_cp["ranked"][0]["tokens_per_s"]


def test_cli_says_which_kernel(capsys):
    assert cli.plan_main(["--model", "gpt2-1.5b", "--cluster", "dgx-h100", "--nodes", "1",
                          "--global-batch-size", "8", "--seq-length", "32768", "--attention", "math"]) == 0
    assert "0 layouts fit" in capsys.readouterr().out
    assert cli.plan_main(["--model", "gpt2-1.5b", "--cluster", "dgx-h100", "--nodes", "1",
                          "--global-batch-size", "8", "--seq-length", "32768"]) == 0
    assert "(memory counted with flash attention)" in capsys.readouterr().out
    small = ["--world-size", "8", "--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
             "--vocab-size", "256", "--seq-length", "64", "--micro-batch-size", "1"]
    assert cli.main(small) == 0
    assert "attention: flash (Megatron's formula has no s x s score term)" in capsys.readouterr().out
    assert cli.main(small + ["--json"]) == 0
    assert json.loads(capsys.readouterr().out)["attention"].startswith("flash")


def test_calculator_forms_take_the_kernel():
    from labkit.calc import report
    flash, math = (report.calculate("memory", {"attention": k, "seq_length": 8192}) for k in ("flash", "math"))
    assert "(flash attention)" in flash and "(math attention)" in math
    assert report.calculate("memory", {"attention": "sdpa"}).count("attention must be one of") == 1
    assert "memory with math attention" in report.calculate("planner", {"attention": "math", "nodes": 1,
                                                                         "cluster": "dgx-h100", "global_batch_size": 8,
                                                                         "model": "gpt2-774m"})

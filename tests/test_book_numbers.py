"""The numbers the chapters state in prose agree with the code that computes them (issue 24):
the ring's bytes in "Context parallelism", ZB-H1's bubble in "Interleaved pipeline", the --fp16
runs' 20 bytes per parameter in "Pipeline parallelism" and "PTD-P", and the 32 K planner claim of
"Context parallelism" under one attention assumption. Each test reads the chapter's own text (or
stored output) and recomputes the number with labkit: a chapter that drifts fails here."""
import json
import re
from pathlib import Path

import pytest

from labkit.calc.comm import cp_attention_bytes
from labkit.pipeline_parallel import schedules as S
from labkit.pipeline_parallel.simulate import simulate

BOOK = Path(__file__).resolve().parents[1] / "book"


def _cells(name):
    return json.loads((BOOK / f"{name}.ipynb").read_text())["cells"]


def _markdown(name) -> str:
    return "\n".join("".join(c["source"]) for c in _cells(name) if c["cell_type"] == "markdown")


def _output_of(name, snippet) -> str:
    """text/plain and stream outputs of the code cell whose source contains ``snippet``."""
    for c in _cells(name):
        if c["cell_type"] == "code" and snippet in "".join(c["source"]):
            parts = []
            for o in c.get("outputs", []):
                parts.append("".join(o.get("text", "")) + "".join(o.get("data", {}).get("text/plain", "")))
            return "\n".join(parts)
    raise AssertionError(f"no code cell with {snippet!r} in {name}")


@pytest.mark.parametrize("c", [2, 4, 8])
@pytest.mark.parametrize("s,b,h,heads,kv_heads", [(32768, 1, 4096, 32, 8), (32768, 1, 1600, 25, 25),
                                                  (4096, 2, 2048, 16, 4)])
def test_ring_bytes_formula_of_the_cp_chapter_equals_calc(c, s, b, h, heads, kv_heads):
    """The p2p bullet states 12 (c-1)/c s b h_kv bytes per rank and layer in 16-bit (6 (c-1)/c
    elements); labkit.calc counts exactly that, forward plus backward."""
    text = _markdown("context-parallel")
    assert r"12\frac{c-1}{c}\, s\, b\, h_{kv}" in text and r"6\frac{c-1}{c}\, s\, b\, h_{kv}" in text
    h_kv = h // heads * kv_heads
    counted = cp_attention_bytes(s, b, h_kv, c, 2, "p2p", hidden_size=h)
    total = sum(sum(phase.values()) for phase in counted.values())
    assert total == 12 * (c - 1) / c * s * b * h_kv


def test_cp_chapter_table_shows_the_formula():
    """The stored per-layer table (Llama-3-8B-like, 32 K tokens) shows 12 (c-1)/c s b h_kv in MiB."""
    out = _output_of("context-parallel", "def per_layer(h, heads, kv_heads, s, cp, kind)")
    for c in (2, 4, 8):
        mib = 12 * (c - 1) / c * 32768 * 1 * 1024 / 2**20
        assert re.search(rf"\b{c}\s+{mib:,.0f} MiB", out), (c, mib, out)


def test_cp_chapter_32k_claim_under_one_attention_assumption():
    """"CP buys speed, not feasibility": with flash attention layouts without CP fit at 32 K, and
    the fastest layout with CP needs no recomputation; only materialized scores need CP to fit."""
    from labkit.calc import ModelConfig, cluster, plan
    xl = ModelConfig(num_layers=48, hidden_size=1600, num_attention_heads=25, seq_length=32768,
                     vocab_size=50257)
    no_cp = plan(xl, cluster("dgx-h100"), 8, context_parallel_sizes=(1,), attention="flash")
    with_cp = plan(xl, cluster("dgx-h100"), 8, context_parallel_sizes=(1, 2, 4, 8), attention="flash")
    math_no_cp = plan(xl, cluster("dgx-h100"), 8, context_parallel_sizes=(1,), attention="math")
    assert len(no_cp["ranked"]) == 9 and not math_no_cp["ranked"]
    best = with_cp["ranked"][0]
    assert best["cp"] > 1 and best["recompute"] == "none"
    text = _markdown("context-parallel")
    stated = re.search(r"about (\d\.\d\d) times the tokens per second", text)
    speedup = best["tokens_per_s"] / no_cp["ranked"][0]["tokens_per_s"]
    assert stated and float(stated.group(1)) == round(speedup, 2), (stated, speedup)
    assert "CP buys speed, not feasibility" in text and "9 layouts fit without CP" in text
    assert "no layout without CP\nfits" not in text and "no layout without CP fits" not in text


@pytest.mark.parametrize("p,m", [(2, 8), (4, 8), (8, 16)])
@pytest.mark.parametrize("f,b,w", [(1, 1, 1), (1, 1.5, 0.5), (2, 1, 1), (1, 2, 1), (1, 0.8, 1.2),
                                   (0.5, 1, 1), (1, 1, 2)])
def test_zb_h1_bubble_as_the_interleaved_chapter_states(p, m, f, b, w):
    """Qi et al.'s (p-1)(T_F + T_B - T_W) when T_W <= T_F and T_W <= T_B; otherwise the
    simulated idle time stays at (p-1) max(T_F, T_B), as the chapter says."""
    text = _markdown("interleaved-pipeline")
    assert r"(p-1)(T_F + T_B - T_W)" in text and r"(p-1)\max(T_F, T_B)" in text
    assert "when W is cheap" not in text
    sim = simulate(S.zb_h1(p, m), f, b + w, w)
    idle_per_rank = sim.bubble_fraction * m * (f + b + w) / (p - 1)
    want = f + b - w if (w <= f and w <= b) else max(f, b)
    assert idle_per_rank == pytest.approx(want)
    if f == b == w:
        assert sim.bubble_fraction == pytest.approx((p - 1) / (3 * m))


def test_fp16_runs_counted_at_20_bytes_per_parameter():
    """The 2xH200 runs are --fp16: the pipeline chapter predicts them with Megatron's fp16 bytes,
    fp16 main gradients (grads = params = 2 bytes each) and an fp32 copy of them beside the fp32
    masters and moments (optimizer 16 bytes), 20 in all; neither chapter calls them 18 or 16."""
    import labkit.calc as calc
    from labkit.experiments.report import PRECISION
    fp16 = PRECISION["fp16"]
    assert fp16 is calc.MEGATRON_FP16 and fp16.bytes_per_param == 20
    par = calc.ParallelConfig(world_size=2, pipeline_model_parallel_size=2, micro_batch_size=64,
                              global_batch_size=64)
    for row in calc.memory_per_stage(calc.model("gpt2-774m"), par, fp16, attention="flash"):
        assert row["grads"] == row["params"] and row["optimizer"] == 8 * row["params"]
    out = _output_of("pipeline-parallel", 'fp16 = PRECISION["fp16"]')
    stages = [line.split() for line in out.splitlines()
              if line.split()[:1] in (["0"], ["1"]) and len(line.split()) == 7]  # stage params grads
    assert len(stages) == 2, out
    assert all(cols[1] == cols[2] for cols in stages), stages
    for chapter in ("pipeline-parallel", "ptd-p"):
        text = _markdown(chapter)
        assert "20 bytes" in text and "18 bytes per parameter" not in text and "16 bytes" not in text


def test_interleaved_messages_per_rank_first_last_and_middle():
    """Per microbatch, pipeline rank i sends one message per chunk boundary it feeds: under 1F1B
    [1, 2, ..., 2, 1], interleaved with v chunks 2v - 1 on the first and last ranks and 2v on the
    others (labkit.calc.pp_step_bytes); the chapter says both, never "every rank 2v - 1"."""
    from labkit.calc.comm import pp_step_bytes

    def messages(p, v):
        n = 2 * 3 * 5 * 4       # s b h bytes of one message; m = 7 microbatches
        return [sum(pp_step_bytes(2, 3, 5, 7, p, i, 4, v).values()) / (7 * n) for i in range(p)]
    assert messages(4, 1) == [1, 2, 2, 1] and messages(4, 2) == [3, 4, 4, 3]
    for p in (2, 3, 5):
        for v in (1, 2, 3):
            assert messages(p, v) == [2 * v - 1] + [2 * v] * (p - 2) + [2 * v - 1]
    text = _markdown("interleaved-pipeline")
    assert "[3, 4, 4, 3]" in text and "$2v$\ninstead of 2" in text
    assert not re.search(r"(every|each) rank sends \$?2v ?- ?1", text, re.I)


def test_planning_ring_latency_at_512_and_1024_ranks():
    """NCCL's ring latency the planning chapter quotes for an FSDP all-gather: 512 ranks on 64 nodes
    and 1,024 on 128, by labkit's own nccl_ring_latency (the inter-node steps included)."""
    from labkit.calc.hardware import NCCL_BASE_US, NCCL_NET_STEP_US, NCCL_NVLINK_STEP_US, nccl_ring_latency
    for ranks, nodes, quoted in ((512, 64, "2.41 ms"), (1024, 128, "4.83 ms")):
        got = nccl_ring_latency("all_gather", ranks, nodes)
        by_hand = NCCL_BASE_US + (ranks - nodes) * NCCL_NVLINK_STEP_US + (nodes - 1) * NCCL_NET_STEP_US
        assert got == pytest.approx(by_hand * 1e-6)
        assert f"{got * 1e3:.2f} ms" == quoted
        assert quoted in _markdown("planning")
    assert "1.7 ms" not in _markdown("planning")


def test_planning_leads_with_the_held_out_error():
    """Only the frozen held-out set is out of sample: the chapter quotes it first, labels
    leave-one-source-out "constants held out, design not", and their ratio is about 2.5."""
    text = _markdown("planning")
    headline = text[text.index("**The headline.**"):]
    assert headline.index("17.5%") < headline.index("6.8%")
    assert "constants held out, design not" in text and "three\ntimes" not in text
    assert "about 2.5\ntimes" in text and 2.4 < 17.5 / 6.8 < 2.6 and 2.4 < 20.3 / 8.2 < 2.6


def test_h200_memory_gaps_as_the_chapters_state_them():
    """Measured minus predicted memory per GPU of the 2xH200 --fp16 runs (Megatron's 20 B/param),
    as the bridge chapter prints and states them, the pipeline chapter's GPU 0 and troubleshooting's
    TP 2 runs: recomputed here from the data and labkit.experiments.report."""
    import math

    import pandas as pd

    import labkit.calc as calc
    from labkit.experiments.catalogue import CATALOGUE
    from labkit.experiments.report import PRECISION, full_size_prediction
    gap = {e.id: max(e.mem_gib) - full_size_prediction(e)["calc GiB/GPU"]
           for e in CATALOGUE.values() if e.mem_gib and not e.oom}
    h200 = [g for i, g in gap.items() if i.startswith("train-")]
    everything = list(gap.values())
    printed = f"2x H200: measured minus predicted memory {min(h200):.1f} to {max(h200):.1f} GiB per GPU"
    assert printed in _output_of("megatron-bridge", "measured minus predicted memory")
    assert f"by the {math.floor(min(everything))} to {round(max(everything))} GiB" in _markdown("megatron-bridge")
    tp2 = [gap["train-tp2-gpt2-large-2gpu"], gap["train-sp2-gpt2-large-2gpu"]]
    assert all(abs(g - 5.4) < 0.1 for g in tp2), tp2          # troubleshooting: "about 5.4 GiB above"
    assert "about 5.4 GiB above the runs' own 20 bytes" in (BOOK / "troubleshooting.md").read_text()
    runs = pd.read_csv(BOOK.parent / "data" / "h200x2_gpt2large_strategies.csv").set_index("strategy")
    par = calc.ParallelConfig(world_size=2, pipeline_model_parallel_size=2, micro_batch_size=64,
                              global_batch_size=64)
    first = calc.memory_per_stage(calc.model("gpt2-774m"), par, PRECISION["fp16"], attention="flash")[0]
    gpu0 = runs.loc["PP2", "mem_gpu0_mib"] / 1024 - first["total"] / 2**30
    assert f"GPU 0 within {gpu0:.1f} GiB" in _markdown("pipeline-parallel")


def test_native_chapter_counts_units_from_its_own_table():
    """pytorch-native: labkit's ZeRO-3 cuts the model in units too (embedding, layers, head), so its
    stored byte table shows 8 all-gathers and 4 reduce-scatters per step to FSDP2's 6 and 3; the
    prose says so (no "one flat buffer"), and answer 2 counts two all-reduces per layer."""
    out = _output_of("pytorch-native", "byte_rows(runs, shown, STEPS)")
    # the wide table prints in column blocks: "native" (calls in parentheses), "predicted", "labkit"
    calls = re.findall(r"FSDP2 \(reshard after forward\)\s+dp\s+all-gather\s+[\d,]+ \((\d+)\)\s*\n"
                       r"\s+reduce-scatter\s+[\d,]+ \((\d+)\)", out)
    assert calls == [("6", "3"), ("8", "4")], calls           # FSDP2's, then labkit's
    text = _markdown("pytorch-native")
    assert "8 all-gathers and 4 reduce-scatters" in text and "to FSDP2's 6 and 3" in text
    assert "with one flat buffer for all parameters" not in text and "three times the calls" not in text
    assert "two\n   all-reduces of $N$ per layer" in text and "four for the 2-layer model" in text


@pytest.mark.parametrize("c", [2, 4, 8])
def test_cp_contiguous_split_blocks(c):
    """Context parallelism, Q2: with the contiguous split rank r holds chunks 2r and 2r + 1 of 2c and
    computes a causal block against every chunk at or before each: 4r + 3 blocks, two of them
    diagonal (half), so 4r + 2 of work; rank 0 computes 3 blocks, 2 of work."""
    for r in range(c):
        blocks = sum(chunk + 1 for chunk in (2 * r, 2 * r + 1))
        assert blocks == 4 * r + 3 and blocks - 1 == 4 * r + 2
    text = _markdown("context-parallel")
    assert "$4 \\cdot 0 + 3 = 3$ blocks, two of them diagonal, 2 of work" in text


def test_native_table_maps_zero_to_the_flags_to_flags_writes():
    """pytorch-native's table gives Megatron's flags for ZeRO-2/3 as labkit.megatron_bridge.to_flags
    writes them (Megatron-FSDP), not --use-torch-fsdp2, which Megatron refuses for a tied GPT, with
    fp16 and with PP (validate_args)."""
    from labkit.megatron_bridge.flags import ZERO_FLAGS
    text = _markdown("pytorch-native")
    for stage in (2, 3):
        flags = " ".join(ZERO_FLAGS[stage][:3])
        assert f"<code>{flags}</code> (<code>to_flags</code>" in text, flags
    assert "<td><code>--use-torch-fsdp2</code></td>" not in text


def test_c10d_commands_pass_no_node_rank():
    """torchrun ignores --node-rank with --rdzv-backend c10d (it warns so): the bridge chapter's
    c10d commands do not pass it."""
    text = _markdown("megatron-bridge")
    commands = re.split(r"\n(?=torchrun )", text)
    c10d = [c.split("\n\n")[0] for c in commands if c.startswith("torchrun ") and "--rdzv-backend c10d" in c.split("\n\n")[0]]
    assert len(c10d) >= 3 and not any("--node-rank" in c for c in c10d), c10d


PROSE_FACTS = [   # (page, says, must not say): issue 34's facts, where only the prose carries them
    ("when-training-goes-wrong", "a monitored barrier and two all-gathers", "(one extra\ncollective each time)"),
    ("when-training-goes-wrong", "by default under bf16 and fp32", "Megatron checks, by default, each"),
    ("when-training-goes-wrong", "labkit's holds 12", "A checkpoint holds 14 bytes per parameter"),
    ("when-training-goes-wrong", "fall by $\\sqrt{10}$", "divides by about three"),
    ("megatron-bridge", "the agent with\n  `GROUP_RANK` 0 hosts a second store", "`torchrun`'s agent of\n  node 0"),
    ("megatron-bridge", "refuses it with `--use-torch-fsdp2` and\n  `--use-megatron-fsdp`", "Megatron-LM's example\n  scripts set it;"),
    ("megatron-bridge", "`SRUN_CPUS_PER_TASK`", "the cores of each agent's node share"),
    ("pytorch-native", "Sea AI Lab", "the \"cut-in-half\" DualPipe of DeepSeek-V3,"),
    ("pytorch-native", "Megatron does otherwise: it cuts the fused QKV weight", "Megatron gives each rank\n  of a group a copy"),
    ("llama-family", "document mask", "could use the simpler all-gather"),
    ("memory-knobs", "in a row or\nnot", "overflows in a row it halves"),
    ("memory-knobs", "about 2.4\ndecimal digits", "about 3 decimal digits per addition"),
]


@pytest.mark.parametrize("page,says,not_says", PROSE_FACTS)
def test_round4_prose_facts(page, says, not_says):
    text = _markdown(page)
    assert says in text and not_says not in text


def test_ten_times_cheaper_save_shrinks_the_interval_by_sqrt_10():
    """Young's interval sqrt(2 delta M): a save 10x cheaper shrinks it by sqrt(10), and both the
    time spent saving (delta / tau) and the work lost per failure (tau / 2) fall by sqrt(10)."""
    from labkit.calc.goodput import young_interval
    delta, mtbf = 21.0, 16 * 86400.0
    tau, tau10 = young_interval(delta, mtbf), young_interval(delta / 10, mtbf)
    assert tau / tau10 == pytest.approx(10 ** 0.5)
    assert (delta / tau) / ((delta / 10) / tau10) == pytest.approx(10 ** 0.5)
    assert f"$\\sqrt{{10}} \\approx {10 ** 0.5:.1f}$" in _markdown("when-training-goes-wrong")


def test_glossary_gqa_and_hysteresis():
    text = (BOOK / "glossary.md").read_text()
    assert "all-gathers the QKV activations" in text and "(in a row or not)" in text
    assert "16 in\n  labkit and 20 in Megatron" in text

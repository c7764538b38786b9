"""The shipped data (data/): every file loads, has the documented shape, and agrees with its source.

Values are checked against the tutorial logs and tables they were copied from (named in data/README.md), and the
corpus against the SHA-256 that data/README.md records, so an edit to either shows up here.
No processes, no torch: tier-1 tests.
"""
from __future__ import annotations

import hashlib
import re
from pathlib import Path

import pandas as pd
import pytest

DATA = Path(__file__).resolve().parent.parent / "data"


def read_csv(name: str) -> pd.DataFrame:
    return pd.read_csv(DATA / name)


# ---------------------------------------------------------------------------------------------
# corpus
# ---------------------------------------------------------------------------------------------
def readme_field(field: str) -> str:
    """The value of ``| field | value |`` in the corpus section of data/README.md."""
    text = (DATA / "README.md").read_text()
    section = text.split("## corpus/tinyshakespeare.txt", 1)[1].split("\n## ", 1)[0]
    m = re.search(rf"^\|\s*{field}\s*\|\s*`?([^|`]+?)`?\s*\|", section, re.M)
    assert m, f"data/README.md has no '{field}' row in the corpus section"
    return m.group(1)


def test_corpus_hash_and_size_match_readme():
    raw = (DATA / "corpus" / "tinyshakespeare.txt").read_bytes()
    assert hashlib.sha256(raw).hexdigest() == readme_field("sha256")
    assert len(raw) == int(readme_field("bytes"))
    assert raw.count(b"\n") == int(readme_field("lines").split()[0])


def test_corpus_is_the_start_of_tinyshakespeare_cut_at_a_line():
    raw = (DATA / "corpus" / "tinyshakespeare.txt").read_bytes()
    assert raw.startswith(b"First Citizen:\nBefore we proceed any further, hear me speak.\n")
    assert raw.endswith(b"MENENIUS:\nFie, fie, fie!\n")
    assert raw.isascii() and b"\r" not in raw
    assert 95_000 <= len(raw) <= 105_000  # "about 100 kB": enough for the labs, small for git


def test_readme_field_parser_can_fail():
    with pytest.raises(AssertionError, match="no 'colour' row"):
        readme_field("colour")


# ---------------------------------------------------------------------------------------------
# the tutorial's H200 runs: GPT-2 large on 2x H200, one strategy at a time
# ---------------------------------------------------------------------------------------------
STRATEGY_COLUMNS = ["strategy", "gpus", "tp", "pp", "cp", "dp", "sequence_parallel",
                    "micro_batch_size", "global_batch_size", "mem_gpu0_mib", "mem_gpu1_mib",
                    "step_ms", "lm_loss_iteration", "note"]


def test_strategies_table_shape():
    df = read_csv("h200x2_gpt2large_strategies.csv")
    assert list(df.columns) == STRATEGY_COLUMNS
    assert list(df.strategy) == ["baseline", "DP2", "TP2", "TP2+SP", "CP2", "PP2"]
    assert df.note.notna().all()


def test_strategies_layout_is_consistent():
    df = read_csv("h200x2_gpt2large_strategies.csv")
    # every GPU is in exactly one tp x pp x cp x dp grid cell
    assert (df.tp * df.pp * df.cp * df.dp == df.gpus).all()
    # Megatron: global batch = micro batch * dp * num_microbatches, num_microbatches integer >= 1
    known = df.dropna(subset=["micro_batch_size"])
    per_step = known.micro_batch_size * known.dp
    assert (known.global_batch_size % per_step == 0).all()
    assert df.set_index("strategy").sequence_parallel.to_dict() == {
        "baseline": False, "DP2": False, "TP2": False, "TP2+SP": True, "CP2": False, "PP2": False}


@pytest.mark.parametrize("strategy, gpu0, gpu1, step_ms, loss", [
    ("baseline", 80161, None, 438.3, 6.159759),
    ("DP2", 80543, 80543, 436.9, 10.29183),
    ("TP2", 85969, 85967, 542.8, 7.733203),
    ("TP2+SP", 71571, 71569, 538.9, 8.350144),
    ("CP2", 81917, 81557, 514.5, 6.092395),
    ("PP2", 61249, 88299, 821.7, 6.909464),
])
def test_strategies_values_equal_seed_003(strategy, gpu0, gpu1, step_ms, loss):
    row = read_csv("h200x2_gpt2large_strategies.csv").set_index("strategy").loc[strategy]
    assert row.mem_gpu0_mib == gpu0
    if gpu1 is None:
        assert pd.isna(row.mem_gpu1_mib)
    else:
        assert row.mem_gpu1_mib == gpu1
    assert row.step_ms == step_ms
    assert row.lm_loss_iteration == loss


def test_strategies_record_the_corrections():
    df = read_csv("h200x2_gpt2large_strategies.csv").set_index("strategy")
    pp2 = df.loc["PP2"]
    assert (pp2.pp, pp2.tp, pp2.dp) == (2, 1, 1)  # the seed's "TP=2, PP=1" label is a slip
    assert "nothing moves to the CPU" in df.loc["TP2+SP"].note


# ---------------------------------------------------------------------------------------------
# the tutorial's CP table: context parallelism, GPT-2 XL on 8x H100
# ---------------------------------------------------------------------------------------------
CP_COLUMNS = ["row_id", "target", "model", "global_batch_size", "seq_length", "cp",
              "mem_gb_per_gpu", "step_ms", "oom"]


def test_cp_table_shape_and_oom_rows():
    df = read_csv("cp_gpt2xl_h100.csv")
    assert list(df.columns) == CP_COLUMNS
    assert list(df.row_id) == [f"r{i}" for i in range(1, 9)]
    assert (df.model == "gpt2-xl").all()
    assert df.oom.dtype == bool
    assert list(df.row_id[df.oom]) == ["r1", "r8"]
    # memory and time are empty exactly when the run ran out of memory
    assert (df.mem_gb_per_gpu.isna() == df.oom).all()
    assert (df.step_ms.isna() == df.oom).all()
    assert df.target.str.startswith(("30", "31")).all()


def test_cp_values_equal_seed_004():
    df = read_csv("cp_gpt2xl_h100.csv").set_index("row_id")
    got = {r: (int(df.loc[r].seq_length), int(df.loc[r].cp), df.loc[r].mem_gb_per_gpu,
               df.loc[r].step_ms) for r in ("r2", "r3", "r4", "r6")}
    assert got == {"r2": (4096, 2, 56, 370), "r3": (4096, 4, 46, 410),
                   "r4": (4096, 8, 40, 550), "r6": (16384, 8, 63, 710)}
    # r7 fits at cp 8; r8 is the same job on half the GPUs and runs out of memory
    assert df.loc["r7"].global_batch_size == df.loc["r8"].global_batch_size == 8
    assert (df.loc["r7"].cp, bool(df.loc["r7"].oom), df.loc["r8"].cp, bool(df.loc["r8"].oom)) == (
        8, False, 4, True)


# ---------------------------------------------------------------------------------------------
# the tutorial's verbatim Megatron log lines
# ---------------------------------------------------------------------------------------------
LINE = re.compile(
    r"^\[(?P<time>[\d\- :]+)\] iteration\s+(?P<it>\d+)/\s*(?P<total>\d+) \| "
    r"consumed samples:\s+(?P<samples>\d+) \| elapsed time per iteration \(ms\): (?P<ms>[\d.]+) \| "
    r"learning rate: (?P<lr>[\d.E+-]+) \| global batch size:\s+(?P<gbs>\d+) \| "
    r"lm loss: (?P<loss>[\d.E+-]+) \| loss scale: [\d.]+ \| grad norm: [\d.]+ \| "
    r"number of skipped iterations:\s+\d+ \| number of nan iterations:\s+\d+ \|$")


def test_megatron_log_lines_parse_and_match_the_tutorial_log():
    lines = (DATA / "megatron_log_h200_dp2.txt").read_text().splitlines()
    assert len(lines) == 2
    parsed = [LINE.match(line) for line in lines]
    assert all(parsed), "a line does not have Megatron's iteration-log format"
    first, second = (m.groupdict() for m in parsed)
    assert (first["it"], first["samples"], first["ms"], first["gbs"]) == ("26", "1664", "436.9", "64")
    assert float(first["loss"]) == 10.29183
    assert (second["it"], second["ms"], float(second["loss"])) == ("27", "437.5", 10.26151)
    # consumed samples advance by the global batch size each iteration
    assert int(second["samples"]) - int(first["samples"]) == int(first["gbs"])


# ---------------------------------------------------------------------------------------------
# gpu-check on an H100 (data/gpu/): the stored comparisons still follow from today's calc
# ---------------------------------------------------------------------------------------------
def test_h100_gpu_check_rows_follow_from_the_stored_times_and_todays_calc():
    import json

    from labkit.gpu_check import step
    from labkit.model import preset
    report = json.loads((DATA / "gpu" / "h100_gpu_check.json").read_text())
    assert report["system"]["gpus"][0]["name"] == "NVIDIA H100 80GB HBM3"
    rows = report["step"]
    assert [(r["model"], r["attention"]) for r in rows] == [
        (m, a) for m in ("gpt2", "gpt2-medium", "gpt2-large") for a in ("math", "sdpa")]
    for r in rows:
        again = step.summarize(r["model"], preset(r["model"]), r["micro_batch_size"], r["step_seconds"],
                               r["peak_memory_bytes"], r["peak_flops"], r["static_bytes"],
                               r["saved_bytes"], r["attention"])
        for key in ("num_parameters", "model_flops", "mfu", "predicted_memory_bytes", "memory_error",
                    "predicted_static_bytes", "predicted_activation_bytes"):
            assert again[key] == pytest.approx(r[key], rel=1e-12), (r["model"], r["attention"], key)
    assert (DATA / "gpu" / "h100_gpu_check.md").read_text().count("| gpt2") == 12  # two tables

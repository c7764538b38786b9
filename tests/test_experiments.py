"""The tutorial's experiments (labkit/experiments/): catalogue, Makefile, CPU-scale runs that
write Megatron-format logs and match the single-device reference on the shipped indexed dataset,
the exported pretrain_gpt.py command, and the report.

Full-scale runs need one GPU per rank (torchrun on a GPU node): not run here.
"""
import contextlib
import dataclasses
import io
import json
import re
import shlex
import subprocess
from pathlib import Path

import pytest
import torch

from labkit import calc
from labkit.calc.cli import parse_flags
from labkit.calc.config import PrecisionConfig
from labkit.calc.megatron import megatron_estimate
from labkit.calc.memory import memory_per_stage
from labkit.config import TrainConfig
from labkit.experiments import CATALOGUE, get, runner
from labkit.experiments.catalogue import MODELS
from labkit.experiments.cli import main as cli_main
from labkit.experiments.report import PRECISION, format_table, full_size_prediction, report
from labkit.megatron_bridge import parse_log
from labkit.reference import train_reference

ROOT = Path(__file__).resolve().parent.parent
# the tutorial's make targets, copied from it (the 2x H200 strategies, the CP table)
NOTE_003 = ["train-baseline-gpt2-large-1gpu", "train-dp2-gpt2-large-2gpu", "train-tp2-gpt2-large-2gpu",
            "train-sp2-gpt2-large-2gpu", "train-cp2-gpt2-large-2gpu", "train-pp2-gpt2-large-2gpu"]
NOTE_004 = ["301-cp1-gpt2xl-gbs4-len4096-oom", "302-cp2-gpt2xl-gbs4-len4096", "304-cp4-gpt2xl-gbs4-len4096",
            "308-cp8-gpt2xl-gbs4-len4096", "311-gpt2xl-gbs4-len8192-cp8", "312-gpt2xl-gbs4-len16384-cp8",
            "313-gpt2xl-gbs8-len8192-cp8", "314-gpt2xl-gbs8-len8192-cp4-oom"]
STRATEGIES = NOTE_003                                  # the six strategy runs, CP included
STEPS = 2
F64 = PrecisionConfig(8, 8, 16, 8, "float64 AdamW")     # 8 B weights, 8 B grads, 2 x 8 B moments


def test_catalogue_holds_every_experiment_of_the_notes_under_its_own_name():
    assert list(CATALOGUE) == NOTE_003 + NOTE_004
    tp2, sp2, pp2 = get("train-tp2"), get("train-sp2"), get("train-pp2")
    assert (tp2.tp, tp2.dp, tp2.micro_batch_size, tp2.global_batch_size, tp2.sequence_parallel) == (2, 1, 64, 64, False)
    assert sp2.sequence_parallel and (pp2.pp, pp2.tp) == (2, 1)          # the note's "TP=2" slip corrected
    assert get("train-dp2").dp == 2 and get("train-baseline").gpus == 1
    r8 = get("314")
    assert (r8.cp, r8.gpus, r8.global_batch_size, r8.seq_length, r8.oom, r8.step_ms) == (4, 4, 8, 8192, True, None)
    assert get("302").step_ms == 370 and get("302").mem_gib == (56e9 / 2**30,)   # "56 GB"
    assert get("302").micro_batch_size == 4 and get("train-tp2").num_attention_heads == 16
    assert any("micro batch" in a for a in get("train-cp2").assumed)   # the note gives none: said so
    with pytest.raises(ValueError, match="matches"):
        get("30")                                                       # ambiguous prefix


def test_makefile_offers_each_id_as_a_one_line_cli_call():
    text = (ROOT / "Makefile").read_text()
    targets = re.findall(r"^([A-Za-z0-9][\w.-]*):\s*$", text, flags=re.M)
    assert [t for t in targets if not t.startswith("experiments-")] == NOTE_003 + NOTE_004
    for target in NOTE_003 + NOTE_004:
        recipe = re.search(rf"^{re.escape(target)}:\s*\n((?:\t.*\n)+)", text, flags=re.M).group(1)
        assert recipe.count("\n") == 1 and recipe.startswith("\t$(RUN) $@ ")
    dry = subprocess.run(["make", "-s", "-n", "-C", str(ROOT), "302-cp2-gpt2xl-gbs4-len4096", "SCALE=cpu"],
                         capture_output=True, text=True, check=True).stdout.split()
    assert dry[:6] == ["python", "-m", "labkit", "experiments", "run", "302-cp2-gpt2xl-gbs4-len4096"]
    assert dry[6:8] == ["--scale", "cpu"]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """The reference runs in this process: one thread, as each rank has (2 cores are shared)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def runs(tmp_path_factory, one_thread):
    """The six strategy experiments at CPU scale, float64, 2 iterations each, in one folder."""
    out = tmp_path_factory.mktemp("outdir")
    done = {}
    for exp_id in STRATEGIES:
        with contextlib.redirect_stdout(io.StringIO()) as printed:
            done[exp_id] = runner.run(exp_id, "cpu", out, steps=STEPS, params_dtype="float64")
        done[exp_id]["printed"] = printed.getvalue()
    return out, done


@pytest.mark.parametrize("exp_id", STRATEGIES)
def test_cpu_run_writes_megatron_logs_and_matches_the_reference(runs, exp_id):
    outdir, done = runs
    run, e = done[exp_id], get(exp_id)
    text = (outdir / exp_id / "logs.txt").read_text()
    iters, memory = parse_log(text, memory=True)
    assert list(iters["iteration"]) == list(range(1, STEPS + 1))
    assert list(iters["consumed_samples"]) == [k * run["config"]["global_batch_size"] for k in range(1, STEPS + 1)]
    assert sorted(memory["rank"]) == list(range(e.gpus))              # one memory line per rank
    assert run["printed"].count("\n iteration ") + run["printed"].startswith(" iteration ") == STEPS
    # parity: the same samples of data/indexed/ on one device, float64
    assert run["config"]["data_path"].endswith("tinyshakespeare_text_document")
    ref = train_reference(world_size=e.gpus, steps=STEPS, seed=runner.SEED, **run["config"])
    torch.testing.assert_close(run["result"].losses, ref, rtol=1e-12, atol=1e-12)
    for logged, exact in zip(iters["lm_loss"], ref):                    # the log rounds to 7 digits
        assert abs(logged - exact) <= 5e-7 * abs(exact)
    # memory: what each rank held is what labkit.calc predicts for its pipeline stage
    model, par = TrainConfig(**run["config"]).megatron_view(e.gpus)
    rows = memory_per_stage(model, par, F64)
    for rank, extra in enumerate(run["result"].ranks):
        want = rows[extra["coords"]["pp"]]
        assert extra["memory"] == {k: want[k] for k in ("params", "grads", "optimizer")}
        logged = memory[memory["rank"] == rank].iloc[0]
        assert abs(logged["optimizer_states"] - want["optimizer"] / 2**20) <= 0.005


def test_report_sets_each_run_beside_the_measurements_and_the_calculators(runs):
    outdir, _ = runs
    df = report(outdir)
    assert list(df["id"]) == NOTE_003 + NOTE_004
    ran = df[df["scale"] == "cpu"]
    assert list(ran["id"]) == STRATEGIES and (ran["iters"] == STEPS).all()
    assert ((ran["held MB"] - ran["pred. MB"]).abs() <= 0.015).all()  # 3 parts logged to 0.01 MB each
    assert df.loc[df["id"] == "train-tp2-gpt2-large-2gpu", "meas. ms"].item() == 542.8
    assert df.loc[df["id"] == "314-gpt2xl-gbs8-len8192-cp4-oom", "meas. GiB/GPU"].item() == "OOM"
    meta = json.loads((outdir / STRATEGIES[0] / "run.json").read_text())
    assert meta["scale"] == "cpu" and meta["steps"] == STEPS
    table = format_table(df)
    assert table.count("\n") == len(df) + 1 and "| train-pp2-gpt2-large-2gpu | PP2 | cpu |" in table


def test_h200_runs_are_fp16_and_predicted_at_20_bytes_per_parameter():
    """--fp16 leaves Megatron's main grads in fp16 (accumulate_allreduce_grads_in_fp32 is turned on
    only under --bf16), and its optimizer steps on an fp32 copy of them (main_param.grad =
    main_grad.float()): 2 + 2 + 4 + 12 = 20 B/param, 2 more than the 18 of a bf16 run."""
    assert PRECISION["fp16"].bytes_per_param == 20 and PRECISION["bf16"].bytes_per_param == 18
    assert [get(i).precision for i in NOTE_003] == ["fp16"] * 6 and {get(i).precision for i in NOTE_004} == {"bf16"}
    for exp_id in NOTE_003:
        e = get(exp_id)
        as_bf16 = full_size_prediction(dataclasses.replace(e, precision="bf16"))["calc GiB/GPU"]
        got = full_size_prediction(e)["calc GiB/GPU"]
        m = calc.model("gpt2-774m").with_(num_attention_heads=16, kv_channels=80)
        par = calc.ParallelConfig(world_size=e.gpus, tensor_model_parallel_size=e.tp, pipeline_model_parallel_size=e.pp,
                                  context_parallel_size=e.cp, sequence_parallel=e.sequence_parallel,
                                  micro_batch_size=e.micro_batch_size, global_batch_size=e.global_batch_size)
        rows = calc.memory_per_stage(m, par, PRECISION["fp16"], attention="flash")
        assert got * 2**30 == max(r["total"] for r in rows)
        peak = max(rows, key=lambda r: r["total"])
        assert (got - as_bf16) * 2**30 == pytest.approx(2 * peak["num_params"], rel=1e-9)  # 4 - 2 B of grads
    one = get("train-baseline-gpt2-large-1gpu")
    gap = full_size_prediction(one)["calc GiB/GPU"] - full_size_prediction(dataclasses.replace(one, precision="bf16"))["calc GiB/GPU"]
    assert round(gap, 2) == 1.44                      # per GPT-2 large replica


@pytest.mark.parametrize("exp_id", NOTE_003 + NOTE_004)
def test_megatron_command_is_megatron_flags_that_megatron_estimate_accepts(exp_id):
    e = get(exp_id)
    text = runner.megatron_command(e)
    words = shlex.split(" ".join(line.rstrip("\\") for line in text.splitlines() if not line.startswith("#")))
    env = words.index("torchrun")
    assert words[env + 1:env + 4] == ["--nproc-per-node", str(e.gpus), "pretrain_gpt.py"]
    assert ("CUDA_DEVICE_MAX_CONNECTIONS=1" in words[:env]) == (e.tp > 1 or e.cp > 1)
    used, other, _ = parse_flags(words[env + 4:])   # raises on any flag Megatron does not have
    assert used["num_layers"] == MODELS[e.model][1] and used.get("tensor_model_parallel_size", 1) == e.tp
    assert used.get("context_parallel_size", 1) == e.cp and used.get("pipeline_model_parallel_size", 1) == e.pp
    assert used.get("sequence_parallel", False) == e.sequence_parallel
    assert (used["micro_batch_size"], used["global_batch_size"], used["seq_length"]) == (
        e.micro_batch_size, e.global_batch_size, e.seq_length)
    assert other["data_path"] == ["data/indexed/tinyshakespeare_text_document"]
    est = megatron_estimate(e.gpus, **used)         # the rule book accepts the exported layout
    labkit_vocab = TrainConfig(**e.train_config("full")).model_config().vocab_size
    assert est["padded_vocab_size"] == labkit_vocab == 256  # NullTokenizer 256, padded as labkit pads


def test_cli_list_run_errors_and_megatron(capsys):
    assert cli_main(["list"]) == 0
    listed = capsys.readouterr().out
    assert all(i in listed for i in NOTE_003 + NOTE_004) and "OOM" in listed
    assert cli_main(["run", "302", "--megatron"]) == 0
    assert "--context-parallel-size 2" in capsys.readouterr().out
    assert cli_main(["run", "nope"]) == 2
    assert "is not an experiment" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.device_count() >= 2, reason="this machine could run it")
def test_full_scale_without_gpus_says_what_to_do(capsys):
    assert cli_main(["run", "train-dp2-gpt2-large-2gpu"]) == 2
    err = capsys.readouterr().err
    assert "needs 2 GPU(s)" in err and "--scale cpu" in err

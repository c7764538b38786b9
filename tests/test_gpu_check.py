"""``python -m labkit gpu-check``: the no-GPU path, the arithmetic, the report, the checks runner.

The measurements themselves run on a GPU; here the same code runs in gloo ranks on the CPU (tiny
model, small buffers), so that only what truly needs CUDA is left to the ``gpu`` test at the end.
"""
import json
import math
import subprocess
import sys
import textwrap

import pytest

from labkit import calc
from labkit.gpu_check import EXIT_NO_GPU, EXIT_USAGE, bandwidth, checks, main, step, verdict
from labkit.gpu_check.report import render_markdown, write_report
from labkit.gpu_check.system import peak_flops
from labkit.model import preset


def _has_gpu():
    import torch
    return torch.cuda.is_available() and torch.cuda.device_count() > 0


# ---- no GPU, bad flags ------------------------------------------------------------------------
def test_no_gpu_says_so_and_exits_with_its_code(tmp_path, capsys):
    if _has_gpu():
        pytest.skip("this machine has a GPU")
    assert main(["--out", str(tmp_path / "r")]) == EXIT_NO_GPU == 3
    err = capsys.readouterr().err
    assert "no CUDA GPU found" in err and "nothing was run" in err
    assert not (tmp_path / "r").exists()


def test_command_line_dispatch(tmp_path):
    if _has_gpu():
        pytest.skip("this machine has a GPU")
    out = subprocess.run([sys.executable, "-m", "labkit", "gpu-check", "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == EXIT_NO_GPU, out.stderr
    assert "gpu-check: no CUDA GPU found" in out.stderr


def test_unknown_model_is_a_usage_error(capsys):
    assert main(["--models", "gpt2,gpt5"]) == EXIT_USAGE
    assert "unknown model(s) ['gpt5']" in capsys.readouterr().err


# ---- arithmetic -------------------------------------------------------------------------------
@pytest.mark.parametrize("n", [1, 2, 3, 8])
def test_bus_bandwidth_is_ring_bytes_per_rank_over_time(n):
    # nccl-tests' busbw equals what one rank sends under the ring algorithm (labkit.calc.comm) / t
    sent = {"all_reduce": calc.ring_all_reduce_bytes, "all_gather": calc.all_gather_bytes,
            "reduce_scatter": calc.reduce_scatter_bytes}
    for op in bandwidth.OPS:
        for size, t in ((2**20, 1e-4), (3 * 2**30, 0.02)):
            bw = bandwidth.bandwidths(op, size, t, n)
            assert bw["algbw"] == size / t
            assert math.isclose(bw["busbw"], sent[op](size, n) / t, rel_tol=1e-12)
    assert bandwidth.bus_factor("all_reduce", 8) == 2 * 7 / 8   # doc/PERFORMANCE.md, "Summary"
    assert bandwidth.bus_factor("all_gather", 8) == bandwidth.bus_factor("reduce_scatter", 8) == 7 / 8
    with pytest.raises(ValueError):
        bandwidth.bandwidths("broadcast", 1, 1, 2)
    with pytest.raises(ValueError):
        bandwidth.bandwidths("all_reduce", 1, 0, 2)


def test_bandwidth_time_is_the_mean_over_ranks():
    per_rank = [[("all_reduce", 1024, 1e-3), ("all_gather", 4096, 2e-3)],
                [("all_reduce", 1024, 3e-3), ("all_gather", 4096, 2e-3)]]
    rows = bandwidth.summarize(per_rank, 2)
    assert [r["seconds"] for r in rows] == pytest.approx([2e-3, 2e-3])
    assert rows[0]["algbw"] == pytest.approx(1024 / 2e-3) and rows[1]["busbw"] == pytest.approx(4096 / 2e-3 / 2)


@pytest.mark.parametrize("name", list(step.MODELS))
def test_step_flops_mfu_and_memory_row(name):
    cfg, b, t, peak, mem = step.MODELS[name], 4, 0.25, 989e12, 20 * 2**30
    row = step.summarize(name, cfg, b, t, mem, peak)
    # Megatron's count, written out: per token 72 L h^2 (GEMMs of a layer, fwd + bwd) plus the
    # causal attention scores 6 L h s (half of 12 L h s), plus the logits 6 h V
    s, L, h, V = cfg.seq_length, cfg.num_layers, cfg.hidden_size, cfg.vocab_size
    flops = b * s * (72 * L * h * h * (1 + s / (12 * h)) + 6 * h * V)
    assert row["model_flops"] == pytest.approx(flops, rel=1e-12)
    assert row["mfu"] == pytest.approx(flops / (t * peak), rel=1e-12)
    assert row["tokens_per_second"] == b * s / t and row["achieved_flops"] == pytest.approx(flops / t)
    assert row["num_parameters"] == cfg.num_parameters()   # calc describes the very same model
    predicted = calc.memory_per_stage(step.calc_model(cfg), calc.ParallelConfig(micro_batch_size=b),
                                      step.PRECISION, dropout=False, attention="math")[0]["total"]
    assert row["predicted_memory_bytes"] == predicted
    assert row["memory_error"] == pytest.approx(mem / predicted - 1)
    assert step.summarize(name, cfg, b, t, None, None)["mfu"] is None  # unknown peak: no MFU


def test_peak_flops_by_device_name():
    h100 = calc.GPUS["H100-80GB"].peak_flops
    assert peak_flops("NVIDIA H100 80GB HBM3") == h100 and peak_flops("NVIDIA H200") == h100
    assert peak_flops("NVIDIA A100-SXM4-80GB") == peak_flops("NVIDIA A100 80GB PCIe") == 312e12
    for other in ("NVIDIA H100 PCIe", "NVIDIA H100 NVL", "NVIDIA H200 NVL", "Tesla V100-SXM2-32GB"):
        assert peak_flops(other) is None   # a different peak than calc knows: no MFU rather than a wrong one


# ---- the measurements, run by gloo ranks on the CPU ------------------------------------------
def test_step_measurement_runs_in_a_rank():
    said = []
    [row] = step.run({"tiny": preset("tiny")}, 2, 1, 2, 1e12, backend="gloo", say=said.append)
    assert "error" not in row, row
    assert row["micro_batch_size"] == 2 and row["step_seconds"] > 0 and row["peak_memory_bytes"] is None
    assert row["mfu"] == pytest.approx(row["model_flops"] / (row["step_seconds"] * 1e12))
    assert abs(row["loss"] - math.log(256)) < 0.5     # random tokens, fresh model: about ln V
    assert said[0].startswith("gpu-check: tiny (math attention):") and "ms/step" in said[1]


def test_step_halves_the_batch_on_out_of_memory(monkeypatch):
    import torch
    tried = []

    def fake(cfg, b, warmup, iters, attention):
        tried.append(b)
        if b > 1:
            raise torch.OutOfMemoryError("CUDA out of memory")
        return 0.5, 123, 5.0, {"static_bytes": 100, "saved_bytes": 20}
    monkeypatch.setattr(step, "_timed_steps", fake)
    got = step.measure_step(preset("tiny"), 4, 1, 1)
    assert tried == [4, 2, 1] and got == {"micro_batch_size": 1, "step_seconds": 0.5,
                                          "peak_memory_bytes": 123, "loss": 5.0,
                                          "static_bytes": 100, "saved_bytes": 20}
    monkeypatch.setattr(step, "_timed_steps", lambda *a: (_ for _ in ()).throw(torch.OutOfMemoryError()))
    assert "out of memory even at micro batch size 1" in step.measure_step(preset("tiny"), 2, 1, 1)["error"]


def test_bandwidth_measurement_runs_in_ranks():
    rows = bandwidth.run(2, sizes=(4096, 65536), warmup=1, iters=2, backend="gloo", say=lambda m: None)
    assert [(r["op"], r["bytes"], r["ranks"]) for r in rows] == [
        (op, size, 2) for op in bandwidth.OPS for size in (4096, 65536)]
    for r in rows:
        assert r["seconds"] > 0 and r["busbw"] == pytest.approx(r["algbw"] * bandwidth.bus_factor(r["op"], 2))


# ---- the checks runner: a real pytest run, its JUnit XML parsed ------------------------------
def test_checks_run_and_parse_pytest_results(tmp_path):
    tests = tmp_path / "tests"
    tests.mkdir()
    (tests / "test_demo.py").write_text(textwrap.dedent("""
        import pytest
        @pytest.mark.gpu
        def test_ok():
            pass
        @pytest.mark.gpu
        def test_bad():
            assert 1 == 2, "one is not two"
        @pytest.mark.gpu
        def test_skipped():
            pytest.skip("needs 8 CUDA device(s), found 1")
        def test_not_gpu():
            pass
    """))
    (tmp_path / "out").mkdir()
    result = checks.run(tmp_path / "out", timeout=120, tests_dir=tests, say=lambda m: None)
    got = {t["name"].split("::")[-1]: t for t in result["tests"]}
    assert sorted(got) == ["test_bad", "test_ok", "test_skipped"]   # -m gpu: the unmarked one is out
    assert got["test_ok"]["outcome"] == "passed" and got["test_bad"]["outcome"] == "failed"
    assert "one is not two" in got["test_bad"]["message"]
    assert got["test_skipped"]["outcome"] == "skipped" and "needs 8 CUDA" in got["test_skipped"]["message"]
    assert result["summary"] == {"passed": 1, "failed": 1, "error": 0, "skipped": 1}
    assert result["returncode"] == 1 and "error" not in result
    assert (tmp_path / "out" / "gpu-tests.log").read_text().strip()


def test_checks_stop_at_their_timeout(tmp_path):
    tests = tmp_path / "tests"
    tests.mkdir()
    (tests / "test_slow.py").write_text("import pytest, time\n@pytest.mark.gpu\ndef test_hang():\n"
                                        "    time.sleep(120)\n")
    result = checks.run(tmp_path, timeout=2, tests_dir=tests, say=lambda m: None)
    assert result["error"].startswith("stopped after 2 s") and result["tests"] == []


# ---- the report ------------------------------------------------------------------------------
def _report():
    cfg = step.MODELS["gpt2"]
    return {
        "created": "2026-08-23T10:00:00+00:00", "verdict": "failed: 1 gpu check(s) failed",
        "system": {"torch": "2.13.0+cu128", "cuda": "12.8", "nccl": "2.27.5", "cudnn": 91000,
                   "driver": "570.1", "python": "3.11.7", "labkit_commit": "abc",
                   "cuda_visible_devices": None,
                   "gpus": [{"index": 0, "name": "NVIDIA H100 80GB HBM3", "memory_bytes": 80 * 2**30,
                             "capability": "9.0", "peak_flops": 989e12}]},
        "topology": "\tGPU0\nGPU0\t X ",
        "step_notes": "micro batch 4 ...",
        "step": [step.summarize("gpt2", cfg, 4, 0.05, 10 * 2**30, 989e12) | {"loss": 10.9},
                 {"model": "gpt2-large", "error": "RankFailed: rank 0 failed:\n...\nOutOfMemoryError: x"}],
        "bandwidth_notes": "2 ranks ...",
        "bandwidth": bandwidth.summarize([[("all_reduce", 2**30, 0.01)]], 2),
        "checks": {"command": "pytest -m gpu tests", "returncode": 1, "summary":
                   {"passed": 1, "failed": 1, "error": 0, "skipped": 1}, "tests": [
                       {"name": "tests.test_a::test_z", "outcome": "passed", "seconds": 1.0, "message": ""},
                       {"name": "tests.test_a::test_b", "outcome": "failed", "seconds": 2.0,
                        "message": "AssertionError: a | b"},
                       {"name": "tests.test_a::test_s", "outcome": "skipped", "seconds": 0.0,
                        "message": "needs 8 CUDA device(s), found 1"}]},
    }


def test_report_markdown_and_json(tmp_path):
    report = _report()
    md = render_markdown(report)
    assert "Verdict: **failed: 1 gpu check(s) failed**" in md
    assert "| 0 | NVIDIA H100 80GB HBM3 | 80.0 | 9.0 | 989 |" in md
    row = report["step"][0]
    assert (f"| gpt2 | math | 124M | 4 x 1024 | 50.0 | {4 * 1024 / 0.05:,.0f} | "
            f"{row['model_flops'] / 0.05 / 1e12:.1f} | {row['mfu']:.1%} | 10.00 | "
            f"{row['predicted_memory_bytes'] / 2**30:.2f} | {row['memory_error']:+.1%} |") in md
    assert "| gpt2-large | math | error: OutOfMemoryError: x |" in md
    assert "| all_reduce | 2 | 1 GiB | 10000.0 | 107.4 | 107.4 |" in md  # 2^30 B / 10 ms; 2(n-1)/n = 1
    lines = md.splitlines()
    first = [i for i, line in enumerate(lines) if line.startswith("| `tests.")]
    assert "test_b" in lines[first[0]] and "a \\| b" in lines[first[0]]   # failures first, | escaped
    md_path, js_path = write_report(report, tmp_path / "r")
    assert json.loads(js_path.read_text()) == report and md_path.read_text() == md


def test_verdict_lists_what_failed():
    report = _report()
    assert verdict(report) == ["gpt2-large: OutOfMemoryError: x", "1 gpu check(s) failed"]
    report["checks"]["summary"]["failed"] = 0
    report["step"].pop()
    assert verdict(report) == []


# ---- on a GPU node ----------------------------------------------------------------------------
@pytest.mark.gpu(devices=1)
def test_gpu_check_measures_on_this_gpu(tmp_path):
    import torch
    rc = main(["--out", str(tmp_path), "--skip-tests", "--models", "gpt2", "--warmup", "1", "--iters", "2",
               "--attention", "math"])
    report = json.loads((tmp_path / "report.json").read_text())
    assert rc == 0, report.get("verdict")
    [row] = report["step"]
    assert row["step_seconds"] > 0 and row["peak_memory_bytes"] > 0 and math.isfinite(row["loss"])
    assert row["micro_batch_size"] == 4 and row["attention"] == "math"
    # between steps: fp32 weights + AdamW's two fp32 moments (grads are None), plus the batch and
    # a fixed overhead that does not grow with the model (cuBLAS workspaces come from the caching
    # allocator: 70-190 MiB measured on an H100 for GPT-2 small to large)
    extra = row["static_bytes"] - row["predicted_static_bytes"]
    assert 0 <= extra < 256 * 2**20, extra
    assert row["saved_bytes"] > 0
    if torch.cuda.device_count() >= 2:
        assert {r["op"] for r in report["bandwidth"]} == set(bandwidth.OPS)
    assert "## Single-GPU training step" in (tmp_path / "report.md").read_text()


def test_sdpa_row_is_the_same_attention():
    """gpu-check's "sdpa" rows swap in torch's fused kernel: the same function as labkit's attention."""
    import torch

    from labkit.model import causal_attention
    q, k, v = torch.randn(3, 2, 4, 7, 5, dtype=torch.float64).unbind(0)   # [b=2, n=4, s=7, d=5]
    assert torch.allclose(step._sdpa(q, k, v), causal_attention(q, k, v), rtol=0, atol=1e-12)
    rows = step.run({"tiny": preset("tiny")}, 2, 0, 1, None, backend="gloo", say=lambda _: None,
                    attentions=("math", "sdpa"))
    assert [r["attention"] for r in rows] == ["math", "sdpa"] and all("error" not in r for r in rows)
    flash = calc.memory_per_stage(step.calc_model(preset("tiny")), calc.ParallelConfig(micro_batch_size=2),
                                  step.PRECISION, dropout=False, attention="flash")[0]["total"]
    assert rows[1]["predicted_memory_bytes"] == flash < rows[0]["predicted_memory_bytes"]
    assert main(["--attention", "flash"]) == EXIT_USAGE

"""``python -m labkit gpu-check``: the whole GPU plan, on the GPUs this machine has, in one command.

GPU users: run this first, from the repository root, after installing the CUDA build of torch::

    python -m labkit gpu-check                  # all of it; about 20 minutes on an 8-GPU node
    python -m labkit gpu-check --out results/   # report folder (default: gpu-check/)
    python -m labkit gpu-check --skip-tests     # only the measurements (a few minutes)
    CUDA_VISIBLE_DEVICES=0,1 python -m labkit gpu-check   # a subset of the GPUs

It uses every visible GPU (1 to 8) and writes ``report.md`` and ``report.json`` (plus the checks'
``gpu-tests.log`` and ``gpu-tests.xml``) into the report folder, rewriting the report after each
part, so a run that stops part-way still leaves what it measured:

1. **System**: torch, CUDA, NCCL, cuDNN and driver versions; the GPUs; ``nvidia-smi topo -m``.
2. **Single-GPU step** on GPU 0 of GPT-2 small (124M), medium (350M) and large (774M): step time,
   tokens/s, MFU, and peak memory next to ``labkit.calc``'s prediction for the same run.
   Batch 4 x 1024 tokens, bf16 autocast, fp32 AdamW; FLOPs by Megatron-LM's count (causal
   attention); each model with labkit's attention and with torch's fused SDPA, and memory split
   into what lives between steps and what the forward saves. Details: :mod:`labkit.gpu_check.step`.
3. **NCCL bandwidth** (2 or more GPUs): algorithm and bus bandwidth of all-reduce, all-gather and
   reduce-scatter from 1 MiB to 1 GiB, as nccl-tests defines them (:mod:`labkit.gpu_check.bandwidth`).
4. **Checks**: ``pytest -m gpu tests/`` — every ``gpu``-marked test (NCCL launches, p2p, pipeline,
   TP/SP/DP, ZeRO, torchrun), one line each: passed, failed, or skipped with the reason (a test
   needing more GPUs than the machine has is skipped).

Exit status: 0 everything ran and every check passed; 1 a check failed or a measurement did not
run (the report says which); 2 bad command-line flags; 3 no CUDA GPU was found: nothing is run and
nothing is written (the message says which torch build is installed).
"""
from __future__ import annotations

import argparse
import datetime
import sys
from pathlib import Path

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_NO_GPU = 0, 1, 2, 3


def parser() -> argparse.ArgumentParser:
    from .step import MODELS
    ap = argparse.ArgumentParser(
        prog="python -m labkit gpu-check", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Run the GPU plan on this machine's GPUs and write a report (labkit/gpu_check).",
        epilog="exit status: 0 all passed, 1 something failed (see the report), 2 bad flags, "
               "3 no CUDA GPU found")
    ap.add_argument("--out", default="gpu-check", help="report folder (default: gpu-check/)")
    ap.add_argument("--models", default=",".join(MODELS),
                    help=f"comma-separated, from {', '.join(MODELS)} (default: all)")
    ap.add_argument("--micro-batch-size", type=int, default=4, help="sequences per step (default 4)")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps first (default 3)")
    ap.add_argument("--iters", type=int, default=10, help="timed steps (default 10)")
    ap.add_argument("--peak-tflops", type=float, default=None,
                    help="the GPU's dense bf16 peak, when its name is not in labkit.calc.GPUS")
    ap.add_argument("--attention", default="math,sdpa",
                    help="comma-separated: math (labkit's, stores the s x s probabilities) and/or sdpa "
                         "(torch's fused scaled_dot_product_attention, FlashAttention kernels); "
                         "default both, one row each")
    ap.add_argument("--skip-tests", action="store_true", help="do not run pytest -m gpu")
    ap.add_argument("--skip-bench", action="store_true", help="no step or bandwidth measurement")
    ap.add_argument("--tests-timeout", type=float, default=3600.0, help="seconds for pytest -m gpu")
    return ap


def verdict(report: dict) -> list:
    """What failed, one phrase each (empty: everything ran and passed)."""
    problems = [f"{r['model']}: {r['error'].splitlines()[-1][:120]}" for r in report.get("step") or []
                if "error" in r]
    if report.get("bandwidth_error"):
        problems.append("NCCL bandwidth: " + report["bandwidth_error"])
    checks = report.get("checks")
    if checks:
        n = checks["summary"]
        if n["failed"] or n["error"]:
            problems.append(f"{n['failed'] + n['error']} gpu check(s) failed")
        if checks.get("error"):
            problems.append(checks["error"])
    return problems


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    from . import step
    from .step import MODELS
    names = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = sorted(set(names) - set(MODELS))
    if unknown:
        print(f"gpu-check: unknown model(s) {unknown}; choose from {sorted(MODELS)}", file=sys.stderr)
        return EXIT_USAGE
    attentions = [a.strip() for a in args.attention.split(",") if a.strip()]
    if not attentions or set(attentions) - set(step.ATTENTION):
        print(f"gpu-check: --attention takes {', '.join(step.ATTENTION)}, got {args.attention!r}",
              file=sys.stderr)
        return EXIT_USAGE
    import torch
    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if n == 0:
        build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
        print(f"gpu-check: no CUDA GPU found (torch {torch.__version__}, {build}); nothing was run "
              f"and no report written. Run it on a GPU node with the CUDA build of torch (README).",
              file=sys.stderr)
        return EXIT_NO_GPU
    from . import bandwidth, checks
    from .report import write_report
    from .system import system_info, topology
    out = Path(args.out)
    report = {"created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "system": system_info(), "topology": topology(), "settings": vars(args)}
    save = lambda: write_report(report, out)  # noqa: E731 - after every part
    save()
    peak = args.peak_tflops * 1e12 if args.peak_tflops else report["system"]["gpus"][0]["peak_flops"]
    if not args.skip_bench:
        report["step_notes"] = (f"micro batch {args.micro_batch_size} (halved on out-of-memory: see "
                                f"the column), {args.warmup} warm-up + {args.iters} timed steps, bf16 "
                                f"autocast, fp32 AdamW; FLOPs: Megatron-LM's count, causal attention. "
                                f"Memory: torch.cuda.max_memory_allocated vs labkit.calc.memory_per_stage "
                                f"(4+4+8 bytes per parameter, 2-byte activations; attention "
                                f"math: s x s probabilities stored, sdpa: calc's flash attention).")
        report["step"] = step.run({m: MODELS[m] for m in names}, args.micro_batch_size,
                                  args.warmup, args.iters, peak, attentions=attentions)
        save()
        if n >= 2:
            report["bandwidth_notes"] = (f"{n} ranks, one per GPU; fp32 buffers; time = mean over ranks "
                                         f"of one operation; algbw = S/t, busbw as in nccl-tests "
                                         f"doc/PERFORMANCE.md.")
            try:
                report["bandwidth"] = bandwidth.run(n)
            except Exception as e:  # noqa: BLE001 - recorded in the report
                report["bandwidth_error"] = f"{type(e).__name__}: {str(e)[-1000:]}"
        else:
            report["bandwidth_notes"] = "not measured: one GPU (collectives need 2 or more)"
        save()
    if not args.skip_tests:
        report["checks"] = checks.run(out, args.tests_timeout)
    problems = verdict(report)
    report["verdict"] = "passed" if not problems else "failed: " + "; ".join(problems)
    md, _ = save()
    print(f"gpu-check: {report['verdict']}. Report: {md}")
    return EXIT_FAILED if problems else EXIT_OK

"""Benchmark, on one GPU: FP8 GEMMs against labkit.fp8's emulation, and Megatron-Core on CUDA.

    PYTHONPATH=. python tests/bench_gpu_extras.py [--out data/gpu/extras.json] [--only fp8,megatron]

Two parts, each written to the JSON file as soon as it ends (the GPU may be taken back):

* ``fp8``: ``torch._scaled_mm`` (E4M3 x E4M3, tensorwise scales, fp32 out) with fast accumulation
  off and on, M = N = 256 and K = 1024 / 4096 / 16384: max |gpu - exact| / max |exact|, exact being
  the float64 product of the same dequantized operands; beside it labkit.fp8.accumulation_error's
  emulation of a 14-bit accumulator (DeepSeek-V3's figure for the H800) promoted to fp32 every K
  and every 128 elements. Then the TFLOP/s of an 8192^3 GEMM in bf16 and in FP8 (tensorwise, bf16
  out, fast accumulation off and on), CUDA events, 3 warm-ups, the median of 10.
* ``megatron``: labkit/megatron's layouts at world size 1 on CUDA (NCCL) and on the CPU (gloo), fp32
  (TF32 off) and float64, 3 steps of 4 microbatches: max |difference| of losses and of gradients
  after step 1 between Megatron-Core, labkit and labkit.reference (always the CPU), and step times.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402


def fp8_part() -> dict:
    from labkit import fp8
    from labkit.fp8 import E4M3
    out = {"device": torch.cuda.get_device_name(), "accuracy": [], "throughput": {}}
    for k in (1024, 4096, 16384):
        g = torch.Generator().manual_seed(k)
        a, b = torch.randn(256, k, generator=g), torch.randn(256, k, generator=g)
        qa, qb = fp8.quantize_tensorwise(a, E4M3), fp8.quantize_tensorwise(b, E4M3)
        exact = qa.dequantize().double() @ qb.dequantize().double().T
        row = {"K": k}
        for fast in (False, True):
            got = torch._scaled_mm(qa.data.cuda(), qb.data.cuda().t(), scale_a=qa.scale_inv.reshape(()).cuda(),
                                   scale_b=qb.scale_inv.reshape(()).cuda(), out_dtype=torch.float32,
                                   use_fast_accum=fast).cpu().double()
            row[f"gpu fast_accum={fast}"] = float((got - exact).abs().max() / exact.abs().max())
        row["cpu fp32 (labkit dequantize_gemm)"] = float(
            (fp8.dequantize_gemm(qa, qb).double() - exact).abs().max() / exact.abs().max())
        if k <= 4096:    # the emulated accumulator adds one product at a time: K passes on the CPU
            row["emulated 14-bit, promoted every K"] = fp8.accumulation_error(qa, qb, k, 14)
            row["emulated 14-bit, promoted every 128"] = fp8.accumulation_error(qa, qb, 128, 14)
        out["accuracy"].append(row)
        print("fp8 accuracy", row, flush=True)
    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    qa, qb = a.to(torch.float8_e4m3fn), b.to(torch.float8_e4m3fn)
    one = torch.ones((), device="cuda")
    cases = {"bf16 matmul": lambda: a @ b.T}
    for fast in (False, True):
        cases[f"fp8 _scaled_mm fast_accum={fast}"] = (lambda f=fast: torch._scaled_mm(
            qa, qb.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16, use_fast_accum=f))
    for name, fn in cases.items():
        for _ in range(3):
            fn()
        times = []
        for _ in range(10):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            fn()
            e.record()
            torch.cuda.synchronize()
            times.append(s.elapsed_time(e) / 1e3)
        t = statistics.median(times)
        out["throughput"][name] = {"seconds": t, "tflops": 2 * n ** 3 / t / 1e12}
        print("fp8 throughput", name, out["throughput"][name], flush=True)
    return out


def megatron_part() -> dict:
    from labkit.megatron.compare import max_diffs, run_layouts, world1_layouts
    layouts = world1_layouts()
    rows = []
    for backend in ("nccl", "gloo"):
        for dtype in ("float32", "float64"):
            t0 = time.perf_counter()
            runs = run_layouts(layouts, steps=3, dtype=dtype, implementations=("megatron", "labkit"),
                               backend=backend)
            for lay in layouts:
                r = runs[lay.name]
                row = {"layout": lay.name, "device": "cuda" if backend == "nccl" else "cpu", "dtype": dtype,
                       "megatron step ms": r["megatron"]["iteration_ms"][1:],
                       "labkit step ms": r["labkit"]["iteration_ms"][1:]}
                for x, y in (("megatron", "reference"), ("labkit", "reference"), ("megatron", "labkit")):
                    row[f"{x} - {y} (loss, grad)"] = max_diffs(r[x], r[y])
                rows.append(row)
                print("megatron", row, flush=True)
            print(f"megatron {backend} {dtype}: {time.perf_counter() - t0:.1f} s", flush=True)
    return {"rows": rows}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="data/gpu/extras.json")
    ap.add_argument("--only", default="fp8,megatron")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_gpu_extras: no CUDA GPU found; nothing was run", file=sys.stderr)
        return 3
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    result = {"torch": torch.__version__, "gpu": torch.cuda.get_device_name(),
              "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    for part in args.only.split(","):
        try:
            result[part] = {"fp8": fp8_part, "megatron": megatron_part}[part]()
        except Exception as e:     # the other part still runs; the error is the record
            import traceback
            traceback.print_exc()
            result[part] = {"error": f"{type(e).__name__}: {e}"}
        out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

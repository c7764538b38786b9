"""The gpu-check report: ``report.json`` (everything, machine-readable) and ``report.md`` (to read).

Pure: ``render_markdown(report)`` formats a report dictionary; ``write_report`` writes both files.
Units: bandwidths in GB/s (10^9 bytes/s, as nccl-tests prints them), memory in GiB (2^30 bytes).
"""
from __future__ import annotations

import json
from pathlib import Path

GIB = 2**30


def _table(header, rows) -> list:
    return ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|",
            *("| " + " | ".join(str(c) for c in row) + " |" for row in rows)]


def _gib(n_bytes) -> str:
    return "n/a" if n_bytes is None else f"{n_bytes / GIB:.2f}"


def _size(n_bytes) -> str:
    return f"{n_bytes / 2**20:g} MiB" if n_bytes < GIB else f"{n_bytes / GIB:g} GiB"


def _system(report) -> list:
    s = report["system"]
    lines = ["## System", "", *_table(["", ""], [
        ["torch", s.get("torch")], ["CUDA", s.get("cuda")], ["NCCL", s.get("nccl")],
        ["cuDNN", s.get("cudnn")], ["driver", s.get("driver")], ["Python", s.get("python")],
        ["labkit commit", s.get("labkit_commit")], ["CUDA_VISIBLE_DEVICES", s.get("cuda_visible_devices")]]), ""]
    lines += _table(["GPU", "name", "memory (GiB)", "compute capability", "peak bf16 (TFLOP/s)"], [
        [g["index"], g["name"], f"{g['memory_bytes'] / GIB:.1f}", g["capability"],
         f"{g['peak_flops'] / 1e12:g}" if g.get("peak_flops") else "unknown"] for g in s["gpus"]])
    topo = report.get("topology")
    lines += ["", "Topology (`nvidia-smi topo -m`):", "", "```", topo or "(nvidia-smi not found)", "```", ""]
    return lines


def _step(report) -> list:
    rows = report.get("step")
    if rows is None:
        return []
    lines = ["## Single-GPU training step (GPU 0)", "", report.get("step_notes", ""), ""]
    body = []
    for r in rows:
        if "error" in r:
            body.append([r["model"], r.get("attention", "math"),
                         "error: " + r["error"].splitlines()[-1][:200]] + [""] * 8)
            continue
        body.append([r["model"], r.get("attention", "math"), f"{r['num_parameters'] / 1e6:.0f}M",
                     f"{r['micro_batch_size']} x {r['seq_length']}", f"{r['step_seconds'] * 1e3:.1f}",
                     f"{r['tokens_per_second']:,.0f}", f"{r['achieved_flops'] / 1e12:.1f}",
                     f"{r['mfu']:.1%}" if r.get("mfu") is not None else "n/a",
                     _gib(r["peak_memory_bytes"]), _gib(r["predicted_memory_bytes"]),
                     "n/a" if r["memory_error"] is None else f"{r['memory_error']:+.1%}"])
    lines += _table(["model", "attention", "parameters", "batch x seq", "step (ms)", "tokens/s", "model TFLOP/s",
                     "MFU", "peak memory (GiB)", "labkit.calc (GiB)", "measured vs calc"], body)
    parts = [r for r in rows if r.get("static_bytes") is not None]
    if parts:
        lines += ["", "Memory in parts (one more, untimed step): between steps, and what the forward adds.", ""]
        lines += _table(["model", "attention", "weights + AdamW, measured (GiB)", "calc params + optimizer (GiB)",
                         "saved by the forward, measured (GiB)", "calc activations (GiB)", "ratio"],
                        [[r["model"], r.get("attention", "math"), _gib(r["static_bytes"]), _gib(r["predicted_static_bytes"]),
                          _gib(r["saved_bytes"]), _gib(r["predicted_activation_bytes"]),
                          f"{r['saved_bytes'] / r['predicted_activation_bytes']:.2f}"] for r in parts])
    return lines + [""]


def _bandwidth(report) -> list:
    rows = report.get("bandwidth")
    if rows is None:
        return ["## NCCL bandwidth", "", report.get("bandwidth_notes", "not measured"), ""]
    lines = ["## NCCL bandwidth", "", report.get("bandwidth_notes", ""), ""]
    body = [[r["op"], r["ranks"], _size(r["bytes"]), f"{r['seconds'] * 1e6:.1f}",
             f"{r['algbw'] / 1e9:.1f}", f"{r['busbw'] / 1e9:.1f}"] for r in rows]
    return lines + _table(["collective", "ranks", "size S", "time (us)", "algbw (GB/s)", "busbw (GB/s)"],
                          body) + [""]


def _checks(report) -> list:
    c = report.get("checks")
    if c is None:
        return ["## Checks", "", "not run (--skip-tests)", ""]
    n = c["summary"]
    lines = ["## Checks", "", f"`{c.get('command', '')}`: {n['passed']} passed, {n['failed']} failed, "
             f"{n['error']} errors, {n['skipped']} skipped" + (f". **{c['error']}**" if c.get("error") else ""), ""]
    order = {"failed": 0, "error": 1, "passed": 2, "skipped": 3}
    tests = sorted(c["tests"], key=lambda t: (order[t["outcome"]], t["name"]))
    body = [[f"`{t['name']}`", t["outcome"], f"{t['seconds']:.1f}", t["message"].replace("|", "\\|")[:200]]
            for t in tests]
    return lines + _table(["test", "result", "seconds", "message"], body) + [""]


def render_markdown(report: dict) -> str:
    """The report as Markdown: system, step/MFU/memory, bandwidth, checks, then the verdict."""
    lines = [f"# labkit gpu-check, {report.get('created', '')}", "",
             f"Verdict: **{report.get('verdict', 'incomplete')}**", ""]
    lines += _system(report) + _step(report) + _bandwidth(report) + _checks(report)
    return "\n".join(lines).rstrip() + "\n"


def write_report(report: dict, out_dir) -> tuple:
    """Write ``report.json`` and ``report.md`` under ``out_dir``; return their paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    js, md = out / "report.json", out / "report.md"
    js.write_text(json.dumps(report, indent=1, sort_keys=True) + "\n")
    md.write_text(render_markdown(report))
    return md, js

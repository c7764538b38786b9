"""``experiments report``: every run under outdir/ beside the tutorial's measurements and labkit.calc.

One row per catalogued experiment. Three groups of columns:

* the labkit run, read back from ``outdir/<ID>/logs.txt`` with ``labkit.megatron_bridge.parse_log``
  (scale, iterations, median time per iteration after the first, last lm loss) and its memory
  lines: the most parameter + gradient + optimizer bytes any rank held, beside labkit.calc's
  prediction for that run (``memory_per_stage``; fp32 AdamW: 4 + 4 + 8 bytes per parameter);
* the tutorial's Megatron-LM run (``data/``): step time and memory per GPU, or "OOM";
* labkit.calc at the tutorial's size (GPT-2 BPE vocabulary, the runs' head count, the runs' precision
  as Megatron allocates it (:data:`PRECISION`), flash attention, no recompute): the peak memory per GPU of
  labkit's model and whether it fits in 90% of the GPU (the planner's criterion), Megatron's own
  estimate (``megatron_estimate``, first stage, which ignores CP in the activations and counts 18 B
  per parameter, bf16's, whatever the run's precision), and the
  predicted step time (``step_time`` on one node of that GPU).
"""
from __future__ import annotations

import json
import statistics
from pathlib import Path

from ..calc.config import MEGATRON_FP16, MIXED_18, PrecisionConfig
from .catalogue import CATALOGUE, MODELS, Experiment

# Bytes per parameter as Megatron-LM allocates them (d98e8a64). Only under --bf16 is
# accumulate_allreduce_grads_in_fp32 turned on (megatron/training/arguments.py validate_args, lines
# 1204-1216); it becomes DDP's grad_reduce_in_fp32 (training.py:2635), and the gradient buffer is
# fp32 with it, else the parameters' dtype (core/distributed/param_and_grad_buffer.py:895). The
# optimizer then steps on an fp32 .grad of every master, `main_param.grad =
# model_param.main_grad.float()` (core/optimizer/optimizer.py:1097): the same memory under bf16, a
# copy under fp16, held until the next zero_grad. So --bf16 runs hold 2 + 4 + 12 = 18 B per
# parameter and --fp16 runs (the H200 runs) 2 + 2 + 4 + 12 = 20 B (Megatron's own table,
# docs/user-guide/features/dist_optimizer.md); labkit's --fp16 frees its copy after the step (calc.LABKIT_FP16, 16 B).
PRECISION = {"bf16": MIXED_18, "fp16": MEGATRON_FP16}

GIB = 2 ** 30
HEADROOM = 0.9   # "fits": at most 90% of the GPU's memory, the planner's criterion (calc.planner.plan)
COLUMNS = ["id", "layout", "scale", "iters", "ms/iter", "lm loss", "held MB", "pred. MB",
           "meas. ms", "meas. GiB/GPU", "calc GiB/GPU", "fits", "Megatron est. GiB", "calc ms"]


def predicted_held_mb(config: dict, world_size: int) -> float:
    """labkit.calc's params + grads + optimizer bytes on the fullest rank of a labkit run (AdamW in
    the run's dtype: weight, gradient and two moments, 4 or 8 bytes each)."""
    from ..calc.memory import memory_per_stage
    from ..config import TrainConfig
    cfg = TrainConfig(**config)
    b = 8 if cfg.params_dtype == "float64" else 4
    model, par = cfg.megatron_view(world_size)
    rows = memory_per_stage(model, par, PrecisionConfig(b, b, 2 * b, b, cfg.params_dtype),
                            attention="math")   # labkit's dense attention (only the states are read)
    return max(r["params"] + r["grads"] + r["optimizer"] for r in rows) / 2 ** 20


def full_size_prediction(e: Experiment) -> dict:
    """labkit.calc for the tutorial's own run: memory per GPU, fit, Megatron's estimate, step time."""
    from ..calc import ParallelConfig, megatron_estimate, memory_per_stage, step_time
    from ..calc.flops import megatron_kwargs
    from ..calc.hardware import CLUSTERS
    from ..calc.presets import model
    m = model(MODELS[e.model][0]).with_(seq_length=e.seq_length)
    if e.num_attention_heads:   # as the runs had them (kv_channels follows: h / heads)
        m = m.with_(num_attention_heads=e.num_attention_heads,
                    kv_channels=m.hidden_size // e.num_attention_heads)
    par = ParallelConfig(world_size=e.gpus, tensor_model_parallel_size=e.tp,
                         pipeline_model_parallel_size=e.pp, context_parallel_size=e.cp,
                         sequence_parallel=e.sequence_parallel, micro_batch_size=e.micro_batch_size,
                         global_batch_size=e.global_batch_size)
    cluster = CLUSTERS[e.cluster].with_(gpus_per_node=e.gpus, nodes=1)
    precision = PRECISION[e.precision]
    peak = max(r["total"] for r in memory_per_stage(m, par, precision, attention="flash"))
    est = megatron_estimate(e.gpus, **megatron_kwargs(m, par))   # what Megatron prints: 18 B, any dtype
    t = step_time(m, par, cluster, precision)
    return {"calc GiB/GPU": peak / GIB, "fits": peak <= HEADROOM * cluster.gpu.memory_bytes,
            "Megatron est. GiB": est["total_bytes"] / GIB, "calc ms": t["step_time"] * 1e3}


def read_run(folder: Path) -> dict | None:
    """The labkit run in ``folder`` (logs.txt + run.json), summarized; None if there is none."""
    from ..megatron_bridge import parse_log
    logs, meta = folder / "logs.txt", folder / "run.json"
    if not logs.is_file():
        return None
    iters, memory = parse_log(logs.read_text(), memory=True)
    info = json.loads(meta.read_text()) if meta.is_file() else {}
    times = list(iters["elapsed_ms"][1:]) or list(iters["elapsed_ms"])
    held = [c for c in ("params", "grads", "optimizer_states") if c in memory]
    row = {"scale": info.get("scale", "?"), "iters": int(iters["iteration"].iloc[-1]),
           "ms/iter": statistics.median(times), "lm loss": float(iters["lm_loss"].iloc[-1]),
           "held MB": float(memory[held].sum(axis=1).max()) if held and len(memory) else None,
           "ranks": len(memory)}
    if "config" in info:
        row["pred. MB"] = predicted_held_mb(info["config"], info["world_size"])
    return row


def report(outdir="outdir", only_runs: bool = False):
    """The table (a pandas DataFrame, COLUMNS) for every experiment, or only those run."""
    import pandas as pd
    rows = []
    for e in CATALOGUE.values():
        run = read_run(Path(outdir) / e.id)
        if only_runs and run is None:
            continue
        measured = "OOM" if e.oom else (f"{max(e.mem_gib):.1f}" if e.mem_gib else "")
        row = {"id": e.id, "layout": e.strategy, "meas. ms": e.step_ms, "meas. GiB/GPU": measured}
        rows.append(row | (run or {}) | full_size_prediction(e))
    return pd.DataFrame(rows).reindex(columns=COLUMNS)


def format_table(df) -> str:
    """The table as Markdown, numbers rounded for reading."""
    fmt = {"ms/iter": "{:.1f}", "lm loss": "{:.4f}", "held MB": "{:.3f}", "pred. MB": "{:.3f}",
           "meas. ms": "{:.1f}", "calc GiB/GPU": "{:.1f}", "Megatron est. GiB": "{:.1f}",
           "calc ms": "{:.0f}", "iters": "{:.0f}"}

    def cell(col, v):
        if v is None or (isinstance(v, float) and v != v):   # None or NaN: not run / not known
            return ""
        if col == "fits":
            return "yes" if v else "no"
        return fmt[col].format(v) if col in fmt and not isinstance(v, str) else str(v)

    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "|".join("---" for _ in COLUMNS) + "|"]
    for _, r in df.iterrows():
        lines.append("| " + " | ".join(cell(c, r[c]) for c in COLUMNS) + " |")
    return "\n".join(lines)

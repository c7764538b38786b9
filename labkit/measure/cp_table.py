"""The gpt2-xl context-parallel runs of data/cp_gpt2xl_h100.csv next to labkit.calc's memory model.

Chapter "Context parallelism". The table records, per run, the global batch, sequence length and
CP size, the memory per GPU and step time Megatron-LM reported on H100 80GB GPUs, and which runs
ran out of memory (r1, r8); data/README.md gives its provenance. It does not record the micro
batch, the number of GPUs or the precision. :data:`ASSUMED` is the reading this module predicts
with, and why: the memory must grow with the global batch at a fixed CP (r5 -> r7: +12 GB), so
the micro batch is the global batch (no accumulation), and it must fall with CP at a fixed batch
(r2 -> r4), so there is no data parallelism: each run uses CP GPUs, DP = 1.
"""
from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TABLE = ROOT / "data" / "cp_gpt2xl_h100.csv"
ASSUMED = {
    "GPUs": "CP (DP = 1, TP = PP = 1)", "micro_batch_size": "global_batch_size",
    "precision": "bf16 weights, fp32 gradients and Adam (labkit.calc MIXED_18), no distributed optimizer",
    "attention": "fused (flash) kernels, as Transformer Engine runs under CP; dropout 0.1 masks",
    "model": "gpt2-xl: 48 layers, hidden 1600, 25 heads, vocabulary 50257 (padded 50304)",
}


def read_table(path=TABLE):
    """data/cp_gpt2xl_h100.csv as a DataFrame (one row per run, r1 to r8)."""
    import pandas as pd
    return pd.read_csv(path)


def predict(seq_length: int, cp: int, global_batch_size: int) -> dict:
    """labkit.calc's memory per GPU for one row under :data:`ASSUMED`: {"params", "grads",
    "optimizer", "activations", "total"} in bytes, and "capacity" (80 GiB)."""
    from ..calc import GPUS, MIXED_18, ModelConfig, ParallelConfig, memory_per_stage
    model = ModelConfig(num_layers=48, hidden_size=1600, num_attention_heads=25, seq_length=seq_length,
                        vocab_size=50257)
    par = ParallelConfig(world_size=cp, context_parallel_size=cp, micro_batch_size=global_batch_size,
                         global_batch_size=global_batch_size)
    row = memory_per_stage(model, par, MIXED_18, dropout=True, attention="flash")[0]
    return {**{k: row[k] for k in ("params", "grads", "optimizer", "activations", "total")},
            "capacity": GPUS["H100-80GB"].memory_bytes}


def compare(path=TABLE, headroom: float = 0.9):
    """One row per run: measured GB next to calc's prediction (GB = 1e9 bytes), the error, the
    share of the card, and whether calc predicts an OOM (more than ``headroom`` of 80 GiB, the
    planner's criterion) against whether the run ran out of memory."""
    import pandas as pd
    rows = []
    for r in read_table(path).itertuples():
        p = predict(int(r.seq_length), int(r.cp), int(r.global_batch_size))
        measured = None if pd.isna(r.mem_gb_per_gpu) else float(r.mem_gb_per_gpu)
        pred = p["total"] / 1e9
        rows.append({"row": r.row_id, "seq": int(r.seq_length), "cp": int(r.cp),
                     "gbs": int(r.global_batch_size), "tokens/GPU": int(r.global_batch_size * r.seq_length // r.cp),
                     "calc GB": round(pred, 1), "activations GB": round(p["activations"] / 1e9, 1),
                     "measured GB": measured,
                     "error %": None if measured is None else round(100 * (pred - measured) / measured, 1),
                     "% of 80 GiB": round(100 * p["total"] / p["capacity"], 1),
                     "calc: OOM": bool(p["total"] > headroom * p["capacity"]), "ran out": bool(r.oom),
                     "step ms": None if pd.isna(r.step_ms) else int(r.step_ms)})
    return pd.DataFrame(rows)

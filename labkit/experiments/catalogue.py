"""The experiments of a Megatron-LM tutorial, under their own names (chapter "From labkit to Megatron-LM").

Vui Seng Chua's tutorial *Megatron, Transformed!* (github.com/vuiseng9/megatron-tutorials) and its
Megatron-LM tutorial (Chua 2025, "Megatron, Transformed!") ran Megatron-LM experiments as ``make`` targets. Two of their tables ship in ``data/``
(provenance in data/README.md), here called the H200 runs and the CP table:

* ``h200x2_gpt2large_strategies.csv`` (the H200 runs): GPT-2 large on 2x H200, one strategy at a time.
  The tutorial names the targets ``train-baseline-gpt2-large-1gpu``, ``train-dp2-gpt2-large-2gpu``, ...
  ``train-pp2-gpt2-large-2gpu``: those are the IDs here.
* ``cp_gpt2xl_h100.csv`` (the CP table): GPT-2 XL with context parallelism on one node of 8x H100, rows
  r1-r8; the IDs are the table's targets ``301-cp1-gpt2xl-gbs4-len4096-oom`` ...

Each :class:`Experiment` carries the layout and batch, what was measured, and what we had to assume
where the tutorial is silent (``assumed``; the CP table is read as ``labkit.measure.cp_table`` reads it).

``train_config(scale)`` is the labkit run. At ``"full"``: the tutorial's model and batch (labkit's byte
vocabulary, fp32). At ``"cpu"``: the same layout and world size on a 4-layer, 64-wide model, the
sequence cut to 64 positions per 1024 (the H200 runs) or per 4096 (the CP table), the H200 runs' batches divided
by 8: small enough for gloo ranks on a laptop. Both read the indexed dataset in data/indexed/.
Pure Python (csv, no pandas): the catalogue is listed without torch.
"""
from __future__ import annotations

import csv
from dataclasses import dataclass, field
from pathlib import Path

DATA = Path(__file__).resolve().parents[2] / "data"
DATA_PATH = str(DATA / "indexed" / "tinyshakespeare_text_document")   # Megatron's --data-path
MODELS = {"gpt2-large": ("gpt2-774m", 36, 1280, 20), "gpt2-xl": ("gpt2-1.5b", 48, 1600, 25)}
NOTE_003_HEADS = 16   # the runs' launch scripts pass --num-attention-heads 16 (data/README.md)
# ... and --fp16 (data/README.md): fp16 weights and main gradients, an fp32 copy of the gradients,
# fp32 master weights and Adam (20 B/param, report.PRECISION)
# the runs' optimizer, from their launch script (github.com/vuiseng9/megatron-lm @ 709cbcce,
# examples/gpt3/_old/100_train_gpt2_large.sh, a copy of Megatron's train_gpt3_175b_distributed.sh)
NOTES_OPTIMIZER = dict(lr=6e-5, clip_grad=1.0, weight_decay=0.1, adam_beta2=0.95)
CPU_MODEL = dict(num_layers=4, hidden_size=64, num_attention_heads=4)
CPU_BATCH_DIVISOR, CPU_SEQ_DIVISOR = {"003": 8, "004": 1}, {"003": 16, "004": 64}


@dataclass(frozen=True)
class Experiment:
    """One experiment of the tutorial: its ID (their make target), layout, batch and measurements."""

    id: str
    note: str                      # "003" (2x H200 strategies) or "004" (CP table)
    label: str                     # the row: strategy ("TP2+SP") or row id ("r3")
    model: str                     # "gpt2-large" | "gpt2-xl"
    gpus: int
    tp: int = 1
    pp: int = 1
    cp: int = 1
    sequence_parallel: bool = False
    micro_batch_size: int = 1
    global_batch_size: int = 1
    seq_length: int = 1024
    hardware: str = ""             # where the tutorial ran it
    cluster: str = ""              # labkit.calc.hardware cluster of that GPU
    step_ms: float | None = None   # measured, None when the run ran out of memory
    mem_gib: tuple = ()            # measured memory per GPU (GiB), one value per GPU reported
    oom: bool = False
    num_attention_heads: int | None = None   # None: the model's own (GPT-2 large 20, XL 25)
    precision: str = "bf16"        # the run's Megatron flag: "fp16" or "bf16" (report.PRECISION)
    assumed: tuple = field(default_factory=tuple)

    @property
    def dp(self) -> int:
        return self.gpus // (self.tp * self.pp * self.cp)

    @property
    def strategy(self) -> str:
        parts = [f"{k}{v}" for k, v in (("TP", self.tp), ("PP", self.pp), ("CP", self.cp),
                                         ("DP", self.dp)) if v > 1]
        return "+".join(parts + (["SP"] if self.sequence_parallel else [])) or "1 GPU"

    def train_config(self, scale: str = "cpu", data_path: str | None = DATA_PATH) -> dict:
        """labkit.train keyword arguments (Megatron's names) of this experiment at ``scale``."""
        if scale not in ("cpu", "full"):
            raise ValueError(f"scale must be 'cpu' or 'full', got {scale!r}")
        layout = dict(tensor_model_parallel_size=self.tp, pipeline_model_parallel_size=self.pp,
                      context_parallel_size=self.cp, sequence_parallel=self.sequence_parallel,
                      data_path=data_path)
        if scale == "full":
            _, layers, hidden, heads = MODELS[self.model]
            return dict(num_layers=layers, hidden_size=hidden,
                        num_attention_heads=self.num_attention_heads or heads,
                        seq_length=self.seq_length, micro_batch_size=self.micro_batch_size,
                        global_batch_size=self.global_batch_size, **NOTES_OPTIMIZER, **layout)
        k = CPU_BATCH_DIVISOR[self.note]
        return dict(CPU_MODEL, seq_length=self.seq_length // CPU_SEQ_DIVISOR[self.note],
                    micro_batch_size=max(1, self.micro_batch_size // k),
                    global_batch_size=max(1, self.global_batch_size // k), **layout)


def _int(text: str | None) -> int | None:
    return int(text) if text not in (None, "") else None


def _strategies() -> list[Experiment]:
    """The H200 runs: GPT-2 large on 2x H200 (NVLink), one strategy per run."""
    target = {"baseline": "baseline", "DP2": "dp2", "TP2": "tp2", "TP2+SP": "sp2", "CP2": "cp2",
              "PP2": "pp2"}
    out = []
    with open(DATA / "h200x2_gpt2large_strategies.csv", newline="") as f:
        for r in csv.DictReader(f):
            gpus, mb = int(r["gpus"]), _int(r["micro_batch_size"])
            assumed = ()
            if mb is None:  # CP2: the log gives no micro batch; DP is 1, as in TP2/SP/PP2 (mb = gbs)
                mb = int(r["global_batch_size"])
                assumed = (f"micro batch {mb}: the log gives none; DP = 1, so mb = global batch as "
                           f"in the TP2, TP2+SP and PP2 runs",)
            mem = tuple(round(int(v) / 1024, 1) for v in (r["mem_gpu0_mib"], r["mem_gpu1_mib"]) if v)
            out.append(Experiment(
                id=f"train-{target[r['strategy']]}-gpt2-large-{gpus}gpu", note="003",
                label=r["strategy"], model="gpt2-large", gpus=gpus, tp=int(r["tp"]), pp=int(r["pp"]),
                cp=int(r["cp"]), sequence_parallel=r["sequence_parallel"] == "True",
                micro_batch_size=mb, global_batch_size=int(r["global_batch_size"]), seq_length=1024,
                hardware="2x H200 141GB, NVLink", cluster="dgx-h200", step_ms=float(r["step_ms"]),
                mem_gib=mem, num_attention_heads=NOTE_003_HEADS, precision="fp16", assumed=assumed))
    return out


def _context_parallel() -> list[Experiment]:
    """The CP table ("Context Parallelism"): GPT-2 XL on 1, 2, 4, 8 H100s (DP = 1)."""
    out = []
    with open(DATA / "cp_gpt2xl_h100.csv", newline="") as f:
        for r in csv.DictReader(f):
            cp, mem = int(r["cp"]), r["mem_gb_per_gpu"]
            out.append(Experiment(
                id=r["target"], note="004", label=r["row_id"], model="gpt2-xl", gpus=cp, cp=cp,
                micro_batch_size=int(r["global_batch_size"]), global_batch_size=int(r["global_batch_size"]),
                seq_length=int(r["seq_length"]), hardware="8x H100 80GB SXM5 node, NVLink",
                cluster="dgx-h100", step_ms=float(r["step_ms"]) if r["step_ms"] else None,
                mem_gib=(float(mem) * 1e9 / 2**30,) if mem else (), oom=r["oom"] == "True",
                assumed=("GPUs = CP, so DP = 1 (memory falls as CP grows at a fixed batch)",
                         "micro batch = global batch (r5 -> r7: twice the batch, +12 GB)",
                         "bf16 weights, fp32 gradients and Adam states", "'GB' = 1e9 bytes")))
    return out


CATALOGUE: dict[str, Experiment] = {e.id: e for e in _strategies() + _context_parallel()}


def get(experiment_id: str) -> Experiment:
    """An experiment by ID; a unique prefix works too (``"302"``), as ``make 302<TAB>`` does."""
    if experiment_id in CATALOGUE:
        return CATALOGUE[experiment_id]
    hits = [k for k in CATALOGUE if k.startswith(experiment_id)]
    if len(hits) == 1:
        return CATALOGUE[hits[0]]
    why = f"matches {hits}" if hits else "is not an experiment"
    raise ValueError(f"{experiment_id!r} {why}; `python -m labkit experiments list` shows the IDs")

"""Published, measured training runs (data/published_runs.csv) against the step-time model.

Chapter "Planning a run". ``load_runs`` turns each row into labkit configurations and the
measured step time; ``predict`` runs ``perf.step_time`` on it; ``fit`` finds the constants of
``gemm.ComputeConstants`` on the rows of ``FIT_SOURCES`` only (pure-Python Nelder-Mead on the
squared log error), so the other sources are held out. Pure Python: no numpy, no pandas.
"""
from __future__ import annotations

import csv
import math
from pathlib import Path

from .config import PrecisionConfig, ModelConfig, ParallelConfig
from .flops import paper_flops_per_iteration
from .gemm import ComputeConstants
from .hardware import CLUSTERS, GPUS
from .overlap import OverlapConfig

DATA = Path(__file__).resolve().parents[2] / "data" / "published_runs.csv"
FIT_SOURCES = ("narayanan2021", "megatron_readme_2024", "nemo_2407", "bigscience_tr11", "bigscience_tr3m_v100")
_LINKS = {"A100-80GB": "dgx-a100", "H100-80GB": "dgx-h100", "V100-32GB": "jean-zay-v100"}


def _flops_megatron_r08(model: ModelConfig, par: ParallelConfig) -> float:
    """Megatron-LM r0.8 num_floating_point_operations (training.py at commit d737deb3): attention in full."""
    B, s, L, h = par.gbs, model.seq_length, model.num_layers, model.hidden_size
    q = model.kv_channels * model.num_attention_heads
    gate = 1.5 if model.swiglu else 1.0
    V = model.padded_vocab_size(par.tp)
    return 12 * B * s * L * h * h * ((1 + model.query_groups / model.num_attention_heads + s / h) * q / h
                                     + model.ffn_hidden_size / h * gate + V / (2 * L * h))


def measured_step_time(row: dict, model: ModelConfig, par: ParallelConfig) -> float:
    """Seconds per step from what the source reports (its unit is in ``measured_unit``)."""
    value, unit, n = float(row["measured_value"]), row["measured_unit"], par.world_size
    if unit == "s_per_iter":
        return value
    if unit == "tokens_per_s_per_gpu":
        return par.gbs * model.seq_length / (value * n)
    if unit == "tflops_per_gpu_narayanan_eq3":
        return paper_flops_per_iteration(model, par.gbs, row["recompute"] == "full") / (value * 1e12 * n)
    if unit == "tflops_per_gpu_megatron_r0.8":
        return _flops_megatron_r08(model, par) / (value * 1e12 * n)
    raise ValueError(f"unknown measured_unit {unit!r}")


def _flag(row, key) -> bool:
    return row[key] not in ("", "0", "False", "false")


def run_configs(row: dict) -> dict:
    """The labkit objects of one CSV row, and its measured step time."""
    i = lambda k: int(row[k])
    model = ModelConfig(i("num_layers"), i("hidden_size"), i("num_attention_heads"), seq_length=i("seq_length"),
                        vocab_size=i("vocab_size"), ffn_hidden_size=i("ffn_hidden_size"), swiglu=_flag(row, "swiglu"),
                        num_query_groups=int(row["num_query_groups"]) if row["num_query_groups"] else None,
                        name=row["model"])
    vp = i("vp")
    slots = model.num_layers + int(_flag(row, "account_for_embedding")) + int(_flag(row, "account_for_loss"))
    zero = i("zero_stage")
    par = ParallelConfig(world_size=i("num_gpus"), tensor_model_parallel_size=i("tp"),
                         pipeline_model_parallel_size=i("pp"), context_parallel_size=i("cp"),
                         expert_model_parallel_size=i("ep"),
                         num_layers_per_virtual_pipeline_stage=slots // i("pp") // vp if vp > 1 else None,
                         sequence_parallel=_flag(row, "sequence_parallel"), micro_batch_size=i("micro_batch_size"),
                         global_batch_size=i("global_batch_size"), zero_stage=zero,
                         use_distributed_optimizer=zero >= 1,
                         recompute_granularity=None if row["recompute"] == "none" else row["recompute"],
                         account_for_embedding_in_pipeline_split=_flag(row, "account_for_embedding"),
                         account_for_loss_in_pipeline_split=_flag(row, "account_for_loss"))
    if par.dp != i("dp"):
        raise ValueError(f"{row['run_id']}: DP {par.dp} != the row's {row['dp']}")
    base = CLUSTERS[_LINKS[row["gpu"]]]
    cluster = base.with_(gpu=GPUS[row["gpu"]], gpus_per_node=i("gpus_per_node"),
                         nodes=max(1, par.world_size // i("gpus_per_node")))
    act = 1 if False else 2
    precision = PrecisionConfig(2, 4, 12, act, row["precision"])
    overlap = OverlapConfig(overlap_grad_reduce=_flag(row, "overlap_grad_reduce"),
                            overlap_param_gather=_flag(row, "overlap_param_gather"),
                            tp_comm_overlap=_flag(row, "tp_comm_overlap"),
                            async_tp_backward=_flag(row, "async_tp_backward"),
                            scatter_gather_p2p=_flag(row, "scatter_gather_p2p"))
    return {"row": row, "model": model, "par": par, "cluster": cluster, "precision": precision,
            "overlap": overlap, "fp8": row["precision"] == "fp8", "framework": row["framework"],
            "attention": row["attention"], "measured": measured_step_time(row, model, par)}


def load_runs(path=DATA) -> list:
    """Every row of the published-runs table as ``run_configs`` dicts."""
    with open(path, newline="") as fh:
        return [run_configs(r) for r in csv.DictReader(fh)]


def predict(run: dict, constants: ComputeConstants | None = None) -> dict:
    from .perf import step_time
    return step_time(run["model"], run["par"], run["cluster"], run["precision"], run["overlap"],
                     run["fp8"], run["framework"], run["attention"], constants)


def errors(runs: list, constants: ComputeConstants | None = None) -> list:
    """(predicted - measured) / measured for every run."""
    return [predict(r, constants)["step_time"] / r["measured"] - 1 for r in runs]


def summary(errs: list) -> dict:
    a = sorted(abs(e) for e in errs)
    mid = len(a) // 2
    median = a[mid] if len(a) % 2 else (a[mid - 1] + a[mid]) / 2
    return {"n": len(a), "median_abs": median, "mean_abs": sum(a) / len(a), "max_abs": a[-1],
            "mean_signed": sum(errs) / len(errs)}


# ------------------------------------------------------------------------------------------ fit
PARAMS = ("V100", "A100", "H100", "elementwise_bytes", "deepspeed", "fixed_seconds", "fp8_gemm_speedup",
          "microbatch_seconds")


def constants_from(x) -> ComputeConstants:
    eV, eA, eH, elem, ds, fixed, fp8, mbs = x
    return ComputeConstants(gemm_efficiency=(("V100", eV), ("A100", eA), ("H100", eH)), elementwise_bytes=elem,
                            framework_factor=(("megatron", 1.0), ("deepspeed", ds), ("torchtitan", 1.0)),
                            fixed_seconds=fixed, fp8_gemm_speedup=fp8, microbatch_seconds=mbs)


def _loss(x, runs):
    if min(x) <= 0 or max(x[:3]) > 1.0 or x[6] > 2.0:
        return float("inf")
    k = constants_from(x)
    return sum(math.log(predict(r, k)["step_time"] / r["measured"]) ** 2 for r in runs)


def fit(runs: list, start=(0.85, 0.82, 0.88, 160.0, 1.25, 0.03, 1.4, 0.005), iters=400) -> tuple:
    """Nelder-Mead on the squared log error of ``runs``; returns (constants, x)."""
    n = len(start)
    simplex = [list(start)] + [[v * (1.15 if j == i else 1.0) for j, v in enumerate(start)] for i in range(n)]
    vals = [_loss(p, runs) for p in simplex]
    for _ in range(iters):
        order = sorted(range(n + 1), key=vals.__getitem__)
        simplex, vals = [simplex[i] for i in order], [vals[i] for i in order]
        c = [sum(p[j] for p in simplex[:-1]) / n for j in range(n)]
        refl = [c[j] + (c[j] - simplex[-1][j]) for j in range(n)]
        fr = _loss(refl, runs)
        if fr < vals[0]:
            exp = [c[j] + 2 * (c[j] - simplex[-1][j]) for j in range(n)]
            fe = _loss(exp, runs)
            simplex[-1], vals[-1] = (exp, fe) if fe < fr else (refl, fr)
        elif fr < vals[-2]:
            simplex[-1], vals[-1] = refl, fr
        else:
            con = [c[j] + 0.5 * (simplex[-1][j] - c[j]) for j in range(n)]
            fc = _loss(con, runs)
            if fc < vals[-1]:
                simplex[-1], vals[-1] = con, fc
            else:
                for i in range(1, n + 1):
                    simplex[i] = [simplex[0][j] + 0.5 * (simplex[i][j] - simplex[0][j]) for j in range(n)]
                    vals[i] = _loss(simplex[i], runs)
    best = min(range(n + 1), key=vals.__getitem__)
    return constants_from(simplex[best]), simplex[best]

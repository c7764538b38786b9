"""Published, measured training runs (data/published_runs.csv) against the step-time model.

Chapter "Planning a run". ``load_runs`` turns each row into labkit configurations and the
measured step time; ``predict`` runs ``perf.step_time`` on it; ``fit`` finds the constants of
``gemm.ComputeConstants`` on the rows of ``FIT_SOURCES`` only (pure-Python Levenberg-Marquardt on
log(predicted / measured), each source weighted equally), so the other sources are held out. A
source is one paper or one repository (its pages and tables are the ``table`` column). Pure Python:
no numpy, no pandas.
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
# fitted on these; held out: torchtitan, megatron_bridge, dgxc_benchmarking (frameworks the fit has
# seen, on other clusters, versions and models)
FIT_SOURCES = ("narayanan2021", "megatron_lm", "nemo", "bigscience", "llm_foundry")


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
    base = CLUSTERS[row["cluster"]]
    cluster = base.with_(gpu=GPUS[row["gpu"]], gpus_per_node=i("gpus_per_node"),
                         nodes=max(1, par.world_size // i("gpus_per_node")))
    precision = PrecisionConfig(2, i("grad_reduce_bytes"), 12, 2, row["precision"])
    overlap = OverlapConfig(overlap_grad_reduce=_flag(row, "overlap_grad_reduce"),
                            overlap_param_gather=_flag(row, "overlap_param_gather"),
                            tp_comm_overlap=_flag(row, "tp_comm_overlap"),
                            async_tp_backward=_flag(row, "async_tp_backward"),
                            scatter_gather_p2p=_flag(row, "scatter_gather_p2p"),
                            blocking_p2p=row["framework"] == "deepspeed")
    return {"row": row, "model": model, "par": par, "cluster": cluster, "precision": precision,
            "overlap": overlap, "fp8": row["precision"] == "fp8", "framework": row["framework"],
            "attention": row["attention"], "measured": measured_step_time(row, model, par)}


def load_runs(path=DATA) -> list:
    """Every row of the published-runs table as ``run_configs`` dicts."""
    with open(path, newline="") as fh:
        return [run_configs(r) for r in csv.DictReader(fh)]


def predict(run: dict, constants: ComputeConstants | None = None, parts_only: bool = False) -> dict:
    """``perf.step_time`` of one run (``parts_only``: the seconds only, no MFU; faster)."""
    from .perf import step_parts, step_time
    f = step_parts if parts_only else step_time
    return f(run["model"], run["par"], run["cluster"], run["precision"], run["overlap"],
             run["fp8"], run["framework"], run["attention"], constants)


def errors(runs: list, constants: ComputeConstants | None = None) -> list:
    """(predicted - measured) / measured for every run."""
    return [predict(r, constants, True)["step_time"] / r["measured"] - 1 for r in runs]


def summary(errs: list) -> dict:
    a = sorted(abs(e) for e in errs)
    mid = len(a) // 2
    median = a[mid] if len(a) % 2 else (a[mid - 1] + a[mid]) / 2
    return {"n": len(a), "median_abs": median, "mean_abs": sum(a) / len(a), "max_abs": a[-1],
            "mean_signed": sum(errs) / len(errs)}


# ------------------------------------------------------------------------------------------ fit
# The free constants, by name: (where it goes in ComputeConstants, start, lower, upper). Megatron's
# elementwise_bytes and layer_seconds are held at 0: a free fit drove both to 0 (its kernels are fused).
FREE = {"gemm:V100": (0.5, 0, 1), "gemm:A100": (0.5, 0, 1), "gemm:H100": (0.5, 0, 1),
        "attention:A100": (0.5, 0, 1), "attention:H100": (0.5, 0, 1), "attention:fsdp:H100": (0.5, 0, 1),
        "elementwise:deepspeed": (100.0, 0, None), "elementwise:fsdp": (100.0, 0, None),
        "layer:deepspeed": (1e-3, 0, None), "layer:fsdp": (1e-3, 0, None),
        "factor:deepspeed": (1.0, 0, None), "fixed_seconds": (0.05, 0, None), "fp8_gemm_speedup": (1.5, 1, 2)}


def constants_from(v: dict) -> ComputeConstants:
    """ComputeConstants from a {name in FREE: value} dict."""
    return ComputeConstants(
        gemm_efficiency=tuple((g, v[f"gemm:{g}"]) for g in ("V100", "A100", "H100")),
        attention_efficiency=(("A100", v["attention:A100"]), ("H100", v["attention:H100"]),
                              ("fsdp:H100", v["attention:fsdp:H100"])),
        elementwise_bytes=(("megatron", 0.0), ("deepspeed", v["elementwise:deepspeed"]),
                           ("fsdp", v["elementwise:fsdp"])),
        layer_seconds=(("megatron", 0.0), ("deepspeed", v["layer:deepspeed"]), ("fsdp", v["layer:fsdp"])),
        framework_factor=(("megatron", 1.0), ("deepspeed", v["factor:deepspeed"]), ("fsdp", 1.0)),
        fixed_seconds=v["fixed_seconds"], fp8_gemm_speedup=v["fp8_gemm_speedup"])


def _decode(z: list) -> dict:
    """Unbounded z -> values in (lower, upper): logistic when bounded above, exp otherwise."""
    out = {}
    for zi, (name, (_, lo, hi)) in zip(z, FREE.items()):
        out[name] = lo + (hi - lo) / (1 + math.exp(-zi)) if hi is not None else lo + math.exp(zi)
    return out


def _encode(v: dict) -> list:
    z = []
    for name, (_, lo, hi) in FREE.items():
        t = v[name] - lo
        z.append(math.log(t / (hi - lo - t)) if hi is not None else math.log(t))
    return z


def _solve(A, b):
    """Gaussian elimination with partial pivoting: x with A x = b (small dense systems)."""
    n = len(b)
    M = [row[:] + [bi] for row, bi in zip(A, b)]
    for c in range(n):
        p = max(range(c, n), key=lambda r: abs(M[r][c]))
        M[c], M[p] = M[p], M[c]
        for r in range(c + 1, n):
            f = M[r][c] / M[c][c]
            M[r] = [x - f * y for x, y in zip(M[r], M[c])]
    x = [0.0] * n
    for r in reversed(range(n)):
        x[r] = (M[r][n] - sum(M[r][k] * x[k] for k in range(r + 1, n))) / M[r][r]
    return x


def fit(runs: list, sources=FIT_SOURCES, iters: int = 40, start: dict | None = None) -> tuple:
    """Levenberg-Marquardt on log(predicted / measured) over the runs of ``sources``, each source
    weighted equally (a row weighs 1/sqrt(rows of its source)). Returns (constants, values)."""
    rows = [r for r in runs if r["row"]["source"] in sources]
    count = {s: sum(r["row"]["source"] == s for r in rows) for s in sources}
    w = [1 / math.sqrt(count[r["row"]["source"]]) for r in rows]

    def resid(z):
        k = constants_from(_decode(z))
        return [wi * math.log(predict(r, k, True)["step_time"] / r["measured"]) for wi, r in zip(w, rows)]

    z = _encode(start or {name: v[0] for name, v in FREE.items()})
    res = resid(z)
    cost, lam, n = sum(x * x for x in res), 1e-3, len(z)
    for _ in range(iters):
        cols = []
        for j in range(n):   # forward-difference Jacobian, one column per constant
            zj = z[:]
            zj[j] += 1e-4
            cols.append([(a - b) / 1e-4 for a, b in zip(resid(zj), res)])
        A = [[sum(x * y for x, y in zip(ci, cj)) for cj in cols] for ci in cols]
        g = [sum(x * y for x, y in zip(ci, res)) for ci in cols]
        improved = False
        while lam < 1e8:
            # damping on the diagonal; + 1e-12 keeps a constant no fitted run depends on at its start
            step = _solve([[A[i][j] + (lam * A[i][i] + 1e-12 if i == j else 0.0) for j in range(n)] for i in range(n)],
                          [-gi for gi in g])
            trial = [a + b for a, b in zip(z, step)]
            r2 = resid(trial)
            c2 = sum(x * x for x in r2)
            if c2 < cost:
                improved, done = True, cost - c2 < 1e-10 * cost
                z, res, cost, lam = trial, r2, c2, max(lam / 3, 1e-9)
                break
            lam *= 4
        if not improved or done:
            break
    values = _decode(z)
    return constants_from(values), values

"""Published, measured training runs (data/published_runs.csv) against the step-time model.

Chapter "Planning a run". ``load_runs`` turns each row into labkit configurations and the
measured step time; ``predict`` runs ``perf.step_time`` on it; ``fit`` finds the constants of
``gemm.ComputeConstants`` on the rows of the sources it is given (pure-Python Levenberg-Marquardt on
log(predicted / measured), each source weighted equally). ``evaluate.py`` judges the model by
leaving each source out of the fit in turn. A source is one paper or one repository (its pages and
tables are the ``table`` column). ``HELDOUT`` is the frozen held-out set (data/README.md): read once,
at the end. Pure Python: no numpy, no pandas.
"""
from __future__ import annotations

import csv
import math
from pathlib import Path

from .config import ModelConfig, ParallelConfig, PrecisionConfig, virtual_pipeline_size
from .flops import paper_flops_per_iteration
from .gemm import ComputeConstants
from .hardware import CLUSTERS, GPUS
from .overlap import OverlapConfig

DATA = Path(__file__).resolve().parents[2] / "data" / "published_runs.csv"
HELDOUT = DATA.with_name("published_runs_heldout.csv")
HELDOUT_SHA256 = "ca8cb0f37a33c7188dbb6ebd62509c3814a4335981e8f117561d2466eb38b3a8"   # at the freeze
SOURCES = ("narayanan2021", "megatron_lm", "nemo", "megatron_bridge", "bigscience", "llm_foundry",
           "torchtitan", "dgxc_benchmarking")
# torchtitan's default when an interleaved schedule gets no split points: 2 stages per rank
# (torchtitan/parallelisms/pipelining_utils.py generate_split_points, commit 9dec370)
DEFAULT_VP = {"torchtitan": 2}


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
    if unit == "tokens_per_s":
        return par.gbs * model.seq_length / value
    if unit == "tflops_per_gpu_narayanan_eq3":
        return paper_flops_per_iteration(model, par.gbs, row["recompute"] == "full") / (value * 1e12 * n)
    if unit == "tflops_per_gpu_megatron_r0.8":
        return _flops_megatron_r08(model, par) / (value * 1e12 * n)
    raise ValueError(f"unknown measured_unit {unit!r}")


def _flag(row, key) -> bool:
    return row[key] not in ("", "0", "False", "false")


def _opt_int(row, key):
    return int(row[key]) if row.get(key) else None


def run_configs(row: dict, vp: int | None = None) -> dict:
    """The labkit objects of one CSV row, and its measured step time. A row whose ``vp`` is "?"
    (interleaved, stages per rank not stated) takes ``vp`` if given, else its framework's default
    (``DEFAULT_VP``), and says so in ``vp_assumed``."""
    i = lambda k: int(row[k])
    moe = {}
    if row.get("num_experts"):
        moe = dict(num_experts=i("num_experts"), moe_router_topk=i("moe_router_topk"),
                   moe_ffn_hidden_size=i("moe_ffn_hidden_size"))
    model = ModelConfig(i("num_layers"), i("hidden_size"), i("num_attention_heads"), seq_length=i("seq_length"),
                        vocab_size=i("vocab_size"), ffn_hidden_size=i("ffn_hidden_size"), swiglu=_flag(row, "swiglu"),
                        num_query_groups=int(row["num_query_groups"]) if row["num_query_groups"] else None,
                        kv_channels=_opt_int(row, "kv_channels"),
                        untie_embeddings_and_output_weights=_flag(row, "untie_embeddings") if "untie_embeddings" in row else False,
                        name=row["model"], **moe)
    assumed_vp = row["vp"] == "?"
    acc_embedding, acc_loss = _flag(row, "account_for_embedding"), _flag(row, "account_for_loss")
    if assumed_vp:
        vp = vp or DEFAULT_VP.get(row["framework"], 2)
        # torchtitan's generated split gives the first and last stage one layer less when the layers
        # do not divide: Megatron's split with the embedding and the loss each counted as a layer
        if model.num_layers % (i("pp") * vp):
            acc_embedding = acc_loss = True
    vp = vp or i("vp")
    slots = model.num_layers + int(acc_embedding) + int(acc_loss)
    zero = i("zero_stage")
    first, last = _opt_int(row, "decoder_first_pipeline_num_layers"), _opt_int(row, "decoder_last_pipeline_num_layers")
    uneven = first is not None or last is not None
    par = ParallelConfig(world_size=i("num_gpus"), tensor_model_parallel_size=i("tp"),
                         pipeline_model_parallel_size=i("pp"), context_parallel_size=i("cp"),
                         expert_model_parallel_size=i("ep"), expert_tensor_parallel_size=_opt_int(row, "etp"),
                         num_layers_per_virtual_pipeline_stage=(
                             None if vp == 1 else (1 if uneven else slots // i("pp") // vp)),
                         sequence_parallel=_flag(row, "sequence_parallel"), micro_batch_size=i("micro_batch_size"),
                         global_batch_size=i("global_batch_size"), zero_stage=zero,
                         use_distributed_optimizer=zero >= 1,
                         recompute_granularity=None if row["recompute"] == "none" else row["recompute"].split("_")[0],
                         decoder_first_pipeline_num_layers=first, decoder_last_pipeline_num_layers=last,
                         account_for_embedding_in_pipeline_split=acc_embedding,
                         account_for_loss_in_pipeline_split=acc_loss)
    if par.dp != i("dp"):
        raise ValueError(f"{row['run_id']}: DP {par.dp} != the row's {row['dp']}")
    base = CLUSTERS[row["cluster"]]
    gpn = min(i("gpus_per_node"), par.world_size)     # a job smaller than a node uses part of it
    cluster = base.with_(gpu=GPUS[row["gpu"]], gpus_per_node=gpn, nodes=par.world_size // gpn)
    precision = PrecisionConfig(2, i("grad_reduce_bytes"), 12, 2, row["precision"])
    overlap = OverlapConfig(overlap_grad_reduce=_flag(row, "overlap_grad_reduce"),
                            overlap_param_gather=_flag(row, "overlap_param_gather"),
                            tp_comm_overlap=_flag(row, "tp_comm_overlap"),
                            async_tp_backward=_flag(row, "async_tp_backward"),
                            scatter_gather_p2p=_flag(row, "scatter_gather_p2p"),
                            blocking_p2p=row["framework"] == "deepspeed")
    # torchtitan's selective AC is per-op unless a row says "selective_layer" (its toml default 'op')
    sac = row["recompute"].split("_")[1] if "_" in row["recompute"] else (
        "op" if row["framework"] == "torchtitan" and row["recompute"] == "selective" else None)
    return {"row": row, "model": model, "par": par, "cluster": cluster, "precision": precision, "sac": sac,
            "overlap": overlap, "fp8": row["precision"] == "fp8", "framework": row["framework"],
            "attention": row["attention"], "measured": measured_step_time(row, model, par),
            "vp": vp, "vp_assumed": assumed_vp}


def load_runs(path=DATA) -> list:
    """Every row of the published-runs table as ``run_configs`` dicts."""
    with open(path, newline="") as fh:
        return [run_configs(r) for r in csv.DictReader(fh)]


def heldout_sha256(path=HELDOUT) -> str:
    import hashlib
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def predict(run: dict, constants: ComputeConstants | None = None, parts_only: bool = False) -> dict:
    """``perf.step_time`` of one run (``parts_only``: the seconds only, no MFU; faster)."""
    from .perf import step_parts, step_time
    f = step_parts if parts_only else step_time
    return f(run["model"], run["par"], run["cluster"], run["precision"], run["overlap"],
             run["fp8"], run["framework"], run["attention"], constants, run.get("sac"))


def vp_range(row: dict, constants: ComputeConstants | None = None) -> dict:
    """A row whose stages per rank are unknown (vp "?"): {vp: predicted step seconds} for every vp
    its layers allow (each rank's chunks non-empty), the framework default marked by ``vp_assumed``."""
    out = {}
    for v in range(1, int(row["num_layers"]) // int(row["pp"]) + 1):
        try:
            run = run_configs(row, vp=v)
            if virtual_pipeline_size(run["model"], run["par"]) == v:
                out[v] = predict(run, constants, True)["step_time"]
        except ValueError:
            continue
    return out


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
# The free constants, by name: (start, lower, upper). A constant no fitted run depends on keeps its
# default (fit drops it), and a GPU generation without runs takes the mean efficiency of the others
# (ComputeConstants.efficiency). Per-framework constants (element-wise bytes, per-layer costs, a
# speed factor) were tried and dropped: fitted on one source of a framework, they moved the others
# of that framework away from their measurements (book/planning.ipynb, "What changed").
FREE = {"gemm:V100": (0.7, 0, 1), "gemm:A100": (0.7, 0, 1), "gemm:H100": (0.7, 0, 1),
        "fixed_seconds": (0.05, 0, None), "fp8_ratio": (0.8, 0.5, 0.775 / 0.69)}


DEFAULTS = {name: start for name, (start, _, _) in FREE.items()}


def constants_from(v: dict) -> ComputeConstants:
    """ComputeConstants from a {name in FREE: value} dict; a generation missing from ``v`` is left
    out (it takes the others' mean), a framework constant missing takes its physical default."""
    d = dict(DEFAULTS)
    d.update(v)
    return ComputeConstants(
        gemm_efficiency=tuple((g, v[f"gemm:{g}"]) for g in ("V100", "A100", "H100") if f"gemm:{g}" in v),
        fixed_seconds=d["fixed_seconds"], fp8_ratio=d["fp8_ratio"])


def _used(rows) -> list:
    """The FREE constants some run of ``rows`` depends on."""
    gens = {r["cluster"].gpu.generation for r in rows}
    fp8 = any(r["fp8"] for r in rows)
    return [n for n in FREE if n == "fixed_seconds" or (n == "fp8_ratio" and fp8)
            or (n.startswith("gemm:") and n[5:] in gens)]


def _decode(z: list, names: list) -> dict:
    """Unbounded z -> values in (lower, upper): logistic when bounded above, exp otherwise."""
    out = {}
    for zi, name in zip(z, names):
        _, lo, hi = FREE[name]
        out[name] = lo + (hi - lo) / (1 + math.exp(-zi)) if hi is not None else lo + math.exp(zi)
    return out


def _encode(v: dict, names: list) -> list:
    z = []
    for name in names:
        _, lo, hi = FREE[name]
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


def fit(runs: list, sources=None, iters: int = 40, start: dict | None = None) -> tuple:
    """Levenberg-Marquardt on log(predicted / measured) over the runs of ``sources`` (default: all),
    each source weighted equally (a row weighs 1/sqrt(rows of its source)). Only the constants these
    runs depend on are fitted. Returns (constants, values)."""
    rows = [r for r in runs if sources is None or r["row"]["source"] in sources]
    count = {}
    for r in rows:
        count[r["row"]["source"]] = count.get(r["row"]["source"], 0) + 1
    w = [1 / math.sqrt(count[r["row"]["source"]]) for r in rows]
    names = _used(rows)

    def resid(z):
        k = constants_from(_decode(z, names))
        return [wi * math.log(predict(r, k, True)["step_time"] / r["measured"]) for wi, r in zip(w, rows)]

    z = _encode({n: (start or {}).get(n, FREE[n][0]) for n in names}, names)
    res = resid(z)
    cost, lam, n = sum(x * x for x in res), 1e-3, len(z)
    done = False
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
    values = _decode(z, names)
    return constants_from(values), values

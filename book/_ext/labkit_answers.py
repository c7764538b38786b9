"""Answers of the book's static-page explorers and calculators, as data, from labkit.calc.

One function per explorer or calculator turns a dict of inputs into a JSON-ready dict of numbers
(bytes, FLOPs, seconds: never formatted; the page formats them) or ``{"error": "rule: ..."}``.
The same functions run in two places: when the book is built (the answer a page shows at first
paint, and the answer to every change of one input from there) and in the reader's browser, in a
Web Worker running labkit.calc with Pyodide, for any other input. So every number on the page is
labkit.calc's. Pure Python, standard library + labkit.calc (no torch).

    >>> memory(MEMORY_DEFAULTS)["world_size"]
    1024
"""
from __future__ import annotations

import json

import labkit.calc as calc
from labkit.calc import report

GIB = 2 ** 30

# -- the memory explorer -------------------------------------------------------------------------
# (name, label, choices): every control is a choice among these values, so the build can answer
# every single change from the defaults; sizes of parallel axes are powers of two.
_POW2 = lambda lo, hi: [2 ** k for k in range(lo, hi + 1)]  # noqa: E731
MEMORY_CONTROLS = [
    ("model", "model", sorted(calc.MODELS)),
    ("seq_length", "sequence length s", _POW2(9, 17)),
    ("micro_batch_size", "micro batch b", _POW2(0, 4)),
    ("tensor_model_parallel_size", "TP", _POW2(0, 4)),
    ("sequence_parallel", "SP", [False, True]),
    ("pipeline_model_parallel_size", "PP", _POW2(0, 6)),
    ("virtual_stages", "VPP: model chunks per PP rank", [1, 2, 3, 4, 6, 8]),
    ("context_parallel_size", "CP", _POW2(0, 5)),
    ("expert_model_parallel_size", "EP", _POW2(0, 6)),
    ("data_parallel_size", "DP", _POW2(0, 10)),
    ("num_microbatches", "microbatches per step m", sorted(_POW2(0, 9) + [192])),   # 192: GPT-3's 1536 / DP 8
    ("zero_stage", "ZeRO stage", [0, 1, 2, 3]),
    ("recompute_granularity", "recompute", ["none", "selective", "full"]),
    ("precision", "precision", sorted(calc.PRECISIONS)),
    ("attention", "attention", ["flash", "math"]),
    ("gpu", "GPU (memory line)", sorted(calc.GPUS)),
]
MEMORY_DEFAULTS = {  # GPT-3 175B on 1024 A100s as Narayanan et al. 2021 / Korthikanti et al. 2022 run it
    "model": "gpt3-175b", "seq_length": 2048, "micro_batch_size": 1, "tensor_model_parallel_size": 8,
    "sequence_parallel": True, "pipeline_model_parallel_size": 16, "virtual_stages": 1,
    "context_parallel_size": 1, "expert_model_parallel_size": 1, "data_parallel_size": 8,
    "num_microbatches": 192, "zero_stage": 1, "recompute_granularity": "selective",
    "precision": "mixed18", "attention": "flash", "gpu": "A100-80GB"}
ATTENTION = {"flash": "flash attention (fused kernel: no s x s scores stored)",
             "math": "materialized attention (the s x s softmax, its dropout and mask stored)"}


def memory_configs(v: dict):
    """(ModelConfig, ParallelConfig, PrecisionConfig) of the memory explorer's inputs."""
    unknown = set(v) - set(MEMORY_DEFAULTS)
    if unknown:
        raise ValueError(f"unknown inputs {sorted(unknown)}")
    v = {**MEMORY_DEFAULTS, **v}
    model = calc.model(v["model"]).with_(seq_length=int(v["seq_length"]))
    tp, pp, cp = (int(v[k]) for k in ("tensor_model_parallel_size", "pipeline_model_parallel_size",
                                      "context_parallel_size"))
    dp, mb, m, vpp = (int(v[k]) for k in ("data_parallel_size", "micro_batch_size", "num_microbatches",
                                          "virtual_stages"))
    per_stage = model.num_layers // pp if model.num_layers % pp == 0 else None
    if vpp > 1 and (per_stage is None or per_stage % vpp):
        raise ValueError(f"rule: layers per pipeline stage divisible by the model chunks per rank; "
                         f"{model.num_layers} layers / PP {pp} / v {vpp} is not a whole number")
    zero = int(v["zero_stage"])
    rec = v["recompute_granularity"]
    par = calc.ParallelConfig(
        world_size=tp * pp * cp * dp, tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
        num_layers_per_virtual_pipeline_stage=per_stage // vpp if vpp > 1 else None,
        context_parallel_size=cp, expert_model_parallel_size=int(v["expert_model_parallel_size"]),
        sequence_parallel=bool(v["sequence_parallel"]), micro_batch_size=mb,
        global_batch_size=m * mb * dp, zero_stage=zero, use_distributed_optimizer=zero >= 1,
        recompute_granularity=None if rec == "none" else rec)
    return model, par, calc.PRECISIONS[v["precision"]]


def megatron_why(model, par, precision, attention: str, labkit_act: float, megatron_act: float) -> list:
    """Why Megatron-LM's activation estimate differs from labkit's, for these inputs (one line each).

    Megatron-LM (megatron/training/theoretical_memory_usage.py, d98e8a64) has two formulas: with
    SP and selective recompute, Korthikanti et al. 2022's Table 2 (sbh(18 + 4 ffn/h) per layer, / t);
    in every other case, sbh(10 + 24/t) per layer, + 5%. Neither counts the attention scores.
    """
    sp_sel = par.sequence_parallel and par.recompute_granularity == "selective"
    lines = []
    if par.recompute_granularity == "full":
        lines.append("Megatron's estimate has no case for full recompute: it falls back to its "
                     "without-SP formula and counts every activation of every layer; labkit keeps "
                     "only each layer's input" + (" (split over TP by SP)" if par.sequence_parallel
                                                  and par.tp > 1 else "")
                     + ", plus one layer being recomputed.")
    elif par.sequence_parallel and par.tp > 1 and not sp_sel:
        lines.append("With SP but without selective recompute Megatron falls back to its without-SP "
                     "formula, which does not divide the norm and dropout activations by TP; "
                     "labkit does.")
    if attention == "math" and par.recompute_granularity is None:
        lines.append("Neither of Megatron's formulas counts the attention scores; with materialized "
                     "attention and no recompute labkit counts them (5as/h per token and layer).")
    if par.cp > 1:
        lines.append(f"Megatron ignores context parallelism in activations; labkit divides the "
                     f"sequence by CP {par.cp}.")
    if sp_sel and model.num_query_groups is not None:
        lines.append("Megatron's SP formula assumes one K/V head per query head; labkit follows "
                     f"GQA's {model.query_groups} K/V heads.")
    if model.swiglu and not sp_sel:
        lines.append("Megatron's without-SP formula assumes a 4h GELU MLP; labkit follows the "
                     "SwiGLU shapes.")
    if precision.bytes_activation != 2:
        lines.append(f"Megatron assumes 16-bit activations; this precision stores "
                     f"{precision.bytes_activation} bytes per value.")
    if par.pp > 1:
        lines.append("Megatron estimates the first pipeline stage only: compare it with stage 0.")
    if not lines:
        lines.append(f"Same formula family; the rest is what labkit counts in addition "
                     f"({(labkit_act - megatron_act) / GIB:+.2f} GiB on stage 0).")
    return lines


def memory(v: dict) -> dict:
    """Bytes per GPU for every pipeline stage (labkit.calc.memory_per_stage), Megatron-LM's own
    estimate and which formula it used, for the memory explorer's inputs."""
    try:
        model, par, precision = memory_configs(v)
        attention = {**MEMORY_DEFAULTS, **v}["attention"]
        if attention not in ATTENTION:
            raise ValueError(f"attention must be one of {sorted(ATTENTION)}, got {attention!r}")
        rows = calc.memory_per_stage(model, par, precision, attention=attention)
        est = calc.megatron_estimate(par.world_size, **calc.flops.megatron_kwargs(model, par))
        batch = calc.batch_math(model, par)
    except ValueError as err:
        return {"error": str(err)}
    gpu = calc.GPUS[{**MEMORY_DEFAULTS, **v}["gpu"]]
    keys = ("params", "grads", "optimizer", "activations", "total")
    peak = max(rows, key=lambda r: r["total"])
    return {
        "world_size": par.world_size, "global_batch_size": par.gbs,
        "num_microbatches": batch["num_microbatches"], "virtual_stages": batch["virtual_pipeline_size"],
        "layers_per_stage": model.num_layers // par.pp, "stages": [{k: r[k] for k in keys} for r in rows],
        "peak_bytes": peak["total"], "peak_stage": peak["stage"], "capacity_bytes": gpu.memory_bytes,
        "gpu": gpu.name, "attention": ATTENTION[attention], "warnings": batch["warnings"],
        "megatron": {"weight_and_optimizer_bytes": est["weight_and_optimizer_bytes"],
                     "activation_bytes": est["activation_bytes"], "total_bytes": est["total_bytes"],
                     "formula": est["activation_formula"],
                     "why": megatron_why(model, par, precision, attention, rows[0]["activations"],
                                         est["activation_bytes"])},
    }


def memory_page_data() -> dict:
    """What the page's closed form (``_static/explorers/memory-formula.js``) needs to answer the
    memory explorer without Python: each preset's shape, each precision's bytes, each GPU's memory.
    The page's answer is labkit.calc's formulas transcribed (memory_per_stage and the rule book);
    tests/test_browser_book.py checks it against ``memory()`` on random layouts."""
    fields = ("num_layers", "hidden_size", "num_attention_heads", "vocab_size", "ffn_hidden_size",
              "make_vocab_size_divisible_by", "swiglu", "normalization", "add_bias_linear",
              "position_embedding_type", "untie_embeddings_and_output_weights", "qk_layernorm",
              "num_experts", "moe_router_topk", "moe_ffn_hidden_size", "moe_shared_expert_intermediate_size",
              "max_position_embeddings")
    models = {}
    for name in sorted(calc.MODELS):
        m = calc.model(name)
        models[name] = {**{f: getattr(m, f) for f in fields}, "kv_channels": m.kv_channels,
                        "query_groups": m.query_groups, "moe_layers": m.moe_layers()}
    precisions = {k: {"param": p.bytes_param, "grad": p.bytes_grad, "sharded": p.sharded_bytes,
                      "activation": p.bytes_activation} for k, p in calc.PRECISIONS.items()}
    gpus = {k: {"name": g.name, "memory_bytes": g.memory_bytes} for k, g in calc.GPUS.items()}
    return {"models": models, "precisions": precisions, "gpus": gpus, "attention": ATTENTION}


# -- the calculators page ------------------------------------------------------------------------
def _bubble(par, b) -> float:
    return calc.bubble_fraction(par.pp, b["num_microbatches"], b["virtual_pipeline_size"])


def batch(v: dict) -> dict:
    """DP size, microbatches (= gradient accumulation), tokens per step, bubble."""
    v = {**form_defaults("batch"), **v}
    m, par = report._model(v), report._parallel(v)
    b = calc.batch_math(m, par)
    return {"data_parallel_size": b["data_parallel_size"], "num_microbatches": b["num_microbatches"],
            "tokens_per_step": b["tokens_per_step"], "bubble": _bubble(par, b), "warnings": b["warnings"]}


def forms() -> dict:
    """The calculators' inputs: labkit.calc.report.FORMS (the attention kernel is an input of its
    own there: flash, Megatron-Core's default, or materialized scores)."""
    return {name: [list(f) for f in fields] for name, fields in report.FORMS.items()}


def form_defaults(name: str) -> dict:
    return {f[0]: f[3] for f in forms()[name]}


def _comm_bytes(m, par, prec, b) -> dict:
    """Bytes each GPU sends per step: DP (gradients), TP and CP (per layer x layers x microbatches),
    PP (stage 0), as the calculators page has always shown them (labkit.calc.comm)."""
    s, bmb, h = m.seq_length, par.micro_batch_size, m.hidden_size
    act = prec.bytes_activation
    mbs, layers = b["num_microbatches"], m.num_layers // par.pp
    n0 = sum(calc.stage_params(m, par, 0).values())
    dp = sum(calc.dp_step_bytes(n0 * prec.bytes_grad, par.dp * par.cp, min(par.optimizer_shard_stage, 3),
                                num_microbatches=mbs).values())
    tp = sum(calc.tp_layer_bytes(s // par.cp, bmb, h, par.tp, act, par.sequence_parallel).values())
    pp = sum(calc.pp_step_bytes(s // par.cp, bmb, h, mbs, par.pp, 0, act, b["virtual_pipeline_size"]).values())
    cp = sum(calc.cp_layer_bytes(s, bmb, m.kv_channels * m.query_groups // par.tp, par.cp, act).values())
    return {"dp": dp, "tp": tp * mbs * layers, "pp": pp, "cp": cp * mbs * layers}


def calculator_memory(v: dict) -> dict:
    """The calculators page's memory answer: memory per stage, Megatron's estimate, FLOPs, step."""
    v = {**form_defaults("memory"), **v}
    m, par = report._model(v), report._parallel(v)
    prec = calc.PRECISIONS[v["precision"]]
    attention = v.get("attention", "flash")
    rows = calc.memory_per_stage(m, par, prec, attention=attention)
    est = calc.megatron_estimate(par.world_size, **calc.flops.megatron_kwargs(m, par))
    b = calc.batch_math(m, par)
    flops = calc.model_flops_per_iteration(m, par)
    base = calc.CLUSTERS[v["cluster"]]
    out = {"stages": [{k: r[k] for k in ("stage", "params", "grads", "optimizer", "activations", "total")}
                      for r in rows],
           "capacity_bytes": base.gpu.memory_bytes, "gpu": base.gpu.name,
           "peak_bytes": max(r["total"] for r in rows), "flops_per_iteration": flops,
           "bubble": _bubble(par, b), "warnings": b["warnings"], "comm_bytes": _comm_bytes(m, par, prec, b),
           "attention": ATTENTION[attention],
           "megatron": {"weight_and_optimizer_bytes": est["weight_and_optimizer_bytes"],
                        "activation_bytes": est["activation_bytes"], "formula": est["activation_formula"],
                        "why": megatron_why(m, par, prec, attention, rows[0]["activations"],
                                            est["activation_bytes"])}}
    step = float(v.get("step_time", 0) or 0)
    if step < 0:   # a typo, not "no step time": say so rather than drop it
        raise ValueError(f"step_time must be a positive number of seconds (0 = none), got {step:g}")
    if step > 0:
        out["mfu"] = flops / (step * par.world_size * base.gpu.peak_flops)
    if par.world_size % base.gpus_per_node == 0:
        t = calc.step_time(m, par, base.with_(nodes=par.world_size // base.gpus_per_node), prec)
        out["step"] = {k: t[k] for k in ("step_time", "compute", "bubble", "tp_comm", "pp_comm",
                                         "dp_comm", "mfu")}
        out["cluster"] = base.name
    else:
        out["no_step"] = (f"{par.world_size} GPUs is not a whole number of {base.gpus_per_node}-GPU "
                          f"nodes: no step-time prediction")
    return out


def planner(v: dict, top: int = 5) -> dict:
    """Layouts that fit, best first by predicted tokens/s, and why the winner wins."""
    v = {**form_defaults("planner"), **v}
    m, c = report._model(v), calc.cluster(v["cluster"], int(v["nodes"]))
    cps = tuple(int(x) for x in str(v.get("context_parallel_sizes", "1")).split(","))
    result = calc.plan(m, c, int(v["global_batch_size"]), recompute=("selective", "full"),
                       context_parallel_sizes=cps, attention=v["attention"])
    keys = ("tp", "pp", "cp", "ep", "dp", "micro_batch_size", "recompute", "peak_memory_gib",
            "tokens_per_s", "mfu", "step_time_s")
    return {"n_fit": len(result["ranked"]), "too_big": result["too_big"], "invalid": result["invalid"],
            "attention": ATTENTION[result["attention"]],
            "ranked": [{k: r[k] for k in keys} for r in result["ranked"][:top]],
            "why": calc.explain(result, c)}


CALCULATORS = {"batch": batch, "memory": calculator_memory, "planner": planner}


def _check_numbers(name: str, v: dict):
    """An empty or non-numeric field becomes a clear message (not "cannot convert float NaN")."""
    labels = {f[0]: f[1] for f in forms()[name]}
    for field, label, kind, _default, _choices in forms()[name]:
        if kind in ("int", "float") and field in v:
            x = v[field]
            if x is None or x == "" or (isinstance(x, float) and x != x):
                raise ValueError(f"{labels[field]!r} is empty: type a number")
            if kind == "int" and (isinstance(x, float) and not x.is_integer()):
                raise ValueError(f"{labels[field]!r} must be a whole number, got {x}")


def calculate(name: str, values: dict) -> dict:
    """The answer of explorer or calculator ``name`` (memory-explorer, batch, memory, planner)."""
    try:
        if name == "memory-explorer":
            return memory(values)
        if name not in CALCULATORS:
            raise ValueError(f"unknown calculator {name!r}; choose one of {sorted(CALCULATORS)}")
        _check_numbers(name, values)
        kinds = {f[0]: f[2] for f in forms()[name]}
        unknown = set(values) - set(kinds)
        if unknown:
            raise ValueError(f"calculator {name!r} has no inputs {sorted(unknown)}")
        values = {k: (int(x) if kinds[k] == "int" and isinstance(x, float) and x.is_integer() else x)
                  for k, x in values.items()}
        return CALCULATORS[name](values)
    except (KeyError, TypeError, ValueError, OverflowError, ZeroDivisionError) as err:
        return {"error": str(err)}


def key(values: dict) -> str:
    """Canonical text of an input dict: the page's cache key (JSON, sorted keys, no spaces), as the
    page's JavaScript writes it (a whole float is written as an integer there: 0.0 -> 0)."""
    norm = {k: (int(x) if isinstance(x, float) and x.is_integer() else x) for k, x in values.items()}
    return json.dumps(norm, sort_keys=True, separators=(",", ":"))


def memory_single_changes(defaults: dict) -> dict:
    """{key(inputs): memory(inputs)} for the defaults and every change of one control from them."""
    out = {key(defaults): memory(defaults)}
    for name, _label, choices in MEMORY_CONTROLS:
        for value in choices:
            v = {**defaults, name: value}
            out.setdefault(key(v), memory(v))
    return out

"""The calculators' forms and HTML answers, shared by the notebook widgets and the static page.

Chapter "Calculators". One source for both front-ends: ``FORMS`` describes the inputs of each
calculator (name, label, kind, default, choices); ``calculate(name, values)`` turns a dict of input
values into an HTML answer. ``labkit.widgets`` builds ipywidgets from ``FORMS``; the static page
builds HTML inputs from the same ``FORMS`` (as JSON) and runs ``calculate`` in the browser with
Pyodide. Every number shown carries ``data-key`` so the browser test can compare it with
labkit.calc. A broken rule is shown as a message, never a traceback. Pure Python (no torch).
"""
from __future__ import annotations

import html

from .batch import batch_math
from .comm import cp_layer_bytes, dp_step_bytes, tp_layer_bytes, pp_step_bytes
from .config import PRECISIONS, ParallelConfig
from .flops import megatron_kwargs, model_flops_per_iteration
from .hardware import CLUSTERS, cluster
from .megatron import megatron_estimate
from .memory import memory_per_stage
from .params import stage_params
from .perf import step_time
from .pipeline import bubble_fraction, bubble_share_of_step
from .planner import explain, plan
from .presets import MODELS, model as preset

GIB = 1024 ** 3
_LAYOUT = [("world_size", "GPUs", "int", 8), ("tensor_model_parallel_size", "TP", "int", 1),
           ("pipeline_model_parallel_size", "PP", "int", 1),
           ("num_layers_per_virtual_pipeline_stage", "layers per virtual stage (0 = none)", "int", 0),
           ("context_parallel_size", "CP", "int", 1), ("expert_model_parallel_size", "EP", "int", 1),
           ("sequence_parallel", "sequence parallel", "bool", False),
           ("micro_batch_size", "micro batch", "int", 1), ("global_batch_size", "global batch", "int", 8)]
_ATTENTION = ("attention", "attention kernel (memory)", "choice", "flash", ["flash", "math"])
FORMS = {
    "batch": [("model", "model", "choice", "gpt2-1.5b", sorted(MODELS))]
    + [(n, l, k, d, None) for n, l, k, d in _LAYOUT],
    "memory": [("model", "model", "choice", "gpt3-175b", sorted(MODELS)),
               ("seq_length", "sequence length (0 = preset)", "int", 0, None)]
    + [(n, l, k, d, None) for n, l, k, d in _LAYOUT]
    + [("zero_stage", "ZeRO stage (1 = distributed optimizer)", "choice", "1", ["0", "1", "2", "3"]),
       ("recompute_granularity", "recompute", "choice", "selective", ["none", "selective", "full"]),
       ("precision", "precision", "choice", "mixed18", sorted(PRECISIONS)),
       _ATTENTION,
       ("cluster", "cluster (GPU, links)", "choice", "dgx-a100", sorted(CLUSTERS)),
       ("step_time", "measured step time, s (0 = none)", "float", 0.0, None)],
    "planner": [("model", "model", "choice", "gpt3-175b", sorted(MODELS)),
                ("cluster", "cluster", "choice", "jean-zay-v100", sorted(CLUSTERS)),
                ("nodes", "nodes", "int", 32, None), ("global_batch_size", "global batch", "int", 128, None),
                ("seq_length", "sequence length (0 = preset)", "int", 1024, None),
                ("context_parallel_sizes", "CP sizes searched", "choice", "1", ["1", "1,2", "1,2,4", "1,2,4,8"]),
                _ATTENTION],
}
FORMS["memory"] = [(n, l, k, ({"world_size": 1024, "tensor_model_parallel_size": 8,
                                "pipeline_model_parallel_size": 16, "global_batch_size": 1536,
                                "sequence_parallel": True}.get(n, d)), c)
                   for n, l, k, d, c in FORMS["memory"]]


def defaults(name: str) -> dict:
    return {f[0]: f[3] for f in FORMS[name]}


def _num(key, value, fmt="{:,}"):
    return f'<span data-key="{key}">{fmt.format(value)}</span>'


def _bubble(par: ParallelConfig, b: dict) -> str:
    """The bubble as idle/compute, (p-1)/(v m), and beside it its share of the step, (p-1)/(v m + p-1):
    p = 8, m = 1 is 700% of the compute but 87.5% of the step."""
    args = (par.pp, b["num_microbatches"], b["virtual_pipeline_size"])
    return (f"{_num('bubble', bubble_fraction(*args), '{:.4f}')} of the compute time, "
            f"{_num('bubble_share', bubble_share_of_step(*args), '{:.1%}')} of the step")


def _error(err) -> str:
    return f'<div class="calc-error" data-key="error">invalid layout: {html.escape(str(err))}</div>'


def _parallel(v: dict) -> ParallelConfig:
    rec = v.get("recompute_granularity", "none")
    z = int(v.get("zero_stage", 0))
    return ParallelConfig(
        world_size=int(v["world_size"]), tensor_model_parallel_size=int(v["tensor_model_parallel_size"]),
        pipeline_model_parallel_size=int(v["pipeline_model_parallel_size"]),
        num_layers_per_virtual_pipeline_stage=int(v["num_layers_per_virtual_pipeline_stage"]) or None,
        context_parallel_size=int(v["context_parallel_size"]),
        expert_model_parallel_size=int(v["expert_model_parallel_size"]),
        sequence_parallel=bool(v["sequence_parallel"]), micro_batch_size=int(v["micro_batch_size"]),
        global_batch_size=int(v["global_batch_size"]), zero_stage=z, use_distributed_optimizer=z >= 1,
        recompute_granularity=None if rec == "none" else rec)


def _model(v: dict):
    m = preset(v["model"])
    seq = int(v.get("seq_length", 0) or 0)
    return m.with_(seq_length=seq) if seq else m


def batch_html(v: dict) -> str:
    try:
        m, par = _model(v), _parallel(v)
        b = batch_math(m, par)
    except ValueError as err:
        return _error(err)
    warn = "".join(f'<div class="calc-warning">{html.escape(w)}</div>' for w in b["warnings"])
    return (f"<ul><li>data-parallel size {_num('data_parallel_size', b['data_parallel_size'])}</li>"
            f"<li>microbatches per step (= gradient-accumulation steps) "
            f"{_num('num_microbatches', b['num_microbatches'])}</li>"
            f"<li>tokens per step {_num('tokens_per_step', b['tokens_per_step'])}</li>"
            f"<li>pipeline bubble (p-1)/(v m) "
            f"{_bubble(par, b)}</li></ul>{warn}")


def memory_bars(rows: list, capacity: float) -> str:
    """Stacked horizontal bars per pipeline stage (HTML/CSS) with a dashed line at GPU capacity."""
    colors = {"params": "#4c72b0", "grads": "#dd8452", "optimizer": "#55a868", "activations": "#c44e52"}
    scale = max(capacity, max(r["total"] for r in rows)) * 1.05
    line = (f'<div style="position:absolute;top:-2px;bottom:-2px;left:{100 * capacity / scale:.3f}%;'
            f'border-left:2px dashed black"></div>')
    out = ['<div class="calc-bars" style="font-size:12px;max-width:48em">']
    show = rows if len(rows) <= 8 else rows[:4] + rows[-4:]
    for r in show:
        segs = "".join(f'<div title="{k}: {r[k] / GIB:.2f} GiB" style="height:14px;'
                       f'width:{100 * r[k] / scale:.3f}%;background:{c}"></div>' for k, c in colors.items())
        out.append(f'<div style="display:flex;align-items:center;margin:2px 0">'
                   f'<span style="width:5em">stage {r["stage"]}</span>'
                   f'<div style="flex:1;position:relative;display:flex">{segs}{line}</div>'
                   f'<span style="width:6em;text-align:right">{r["total"] / GIB:.2f} GiB</span></div>')
    legend = " ".join(f'<span style="color:{c}">&#9632; {k}</span>' for k, c in colors.items())
    more = f" (stages 4..{len(rows) - 5} not drawn)" if len(rows) > 8 else ""
    return "".join(out) + f"</div><div>{legend} &nbsp; dashed line: GPU memory{more}</div>"


def memory_html(v: dict) -> str:
    try:
        m, par = _model(v), _parallel(v)
        prec = PRECISIONS[v["precision"]]
        rows = memory_per_stage(m, par, prec, attention=v["attention"])
        est = megatron_estimate(par.world_size, **megatron_kwargs(m, par))
        flops = model_flops_per_iteration(m, par)
        b = batch_math(m, par)
    except ValueError as err:
        return _error(err)
    base = CLUSTERS[v["cluster"]]
    gpu, capacity = base.gpu, base.gpu.memory_bytes
    peak = max(r["total"] for r in rows)
    cols = ("params", "grads", "optimizer", "activations", "total")
    table = "".join(
        "<tr><td>%d</td>%s</tr>" % (r["stage"], "".join(
            "<td>%s</td>" % _num("stage%d_%s" % (r["stage"], k), r[k] / GIB, "{:.3f}") for k in cols))
        for r in rows)
    s, bmb, h = m.seq_length, par.micro_batch_size, m.hidden_size
    act_bytes = prec.bytes_activation
    n0 = sum(stage_params(m, par, 0).values())
    dp_bytes = sum(dp_step_bytes(n0 * prec.bytes_grad, par.dp * par.cp, min(par.optimizer_shard_stage, 3),
                                 num_microbatches=b["num_microbatches"]).values())
    tp_bytes = sum(tp_layer_bytes(s // par.cp, bmb, h, par.tp, act_bytes, par.sequence_parallel).values())
    tp_bytes *= b["num_microbatches"] * (m.num_layers // par.pp)
    pp_bytes = sum(pp_step_bytes(s // par.cp, bmb, h, b["num_microbatches"], par.pp, 0, act_bytes,
                                 b["virtual_pipeline_size"]).values())
    cp_bytes = sum(cp_layer_bytes(s, bmb, m.kv_channels * m.query_groups // par.tp, par.cp, act_bytes).values())
    cp_bytes *= b["num_microbatches"] * (m.num_layers // par.pp)          # ring attention ("p2p")
    mfu, step = "", float(v.get("step_time", 0) or 0)
    if step < 0:   # a typo, not "no step time": say so rather than drop it
        raise ValueError(f"step_time must be a positive number of seconds (0 = none), got {step:g}")
    if step > 0:
        value = flops / (step * par.world_size * gpu.peak_flops)
        mfu = f"<li>MFU at that step time {_num('mfu', value, '{:.4f}')}</li>"
    if par.world_size % base.gpus_per_node == 0:
        t = step_time(m, par, base.with_(nodes=par.world_size // base.gpus_per_node), prec)
        mfu += (f"<li>predicted step {_num('step_time', t['step_time'], '{:.3f}')} s on {base.name}: "
                f"compute {t['compute']:.3f}, bubble {t['bubble']:.3f}, TP comm {t['tp_comm']:.3f}, "
                f"PP comm {t['pp_comm']:.3f}, DP comm {t['dp_comm']:.3f} s; MFU "
                f"{_num('predicted_mfu', t['mfu'], '{:.4f}')}</li>")
    else:
        mfu += (f"<li>no step-time prediction: {par.world_size} GPUs is not a whole number of "
                f"{base.gpus_per_node}-GPU nodes</li>")
    fits = "fits" if peak <= capacity else "does NOT fit"
    return (f"<p>peak {_num('peak_gib', peak / GIB, '{:.3f}')} GiB per GPU: {fits} in "
            f"{capacity / GIB:.1f} GiB ({html.escape(v['attention'])} attention)</p>" + memory_bars(rows, capacity)
            + "<table><tr><th>stage</th><th>weights</th><th>grads</th><th>optimizer</th>"
              "<th>activations</th><th>total (GiB)</th></tr>" + table + "</table>"
            + f"<p>Megatron-LM's own estimate (first stage): weight and optimizer "
              f"{_num('megatron_weight_mb', est['weight_and_optimizer_bytes'] / 2**20, '{:.2f}')} MB, "
              f"activation {_num('megatron_activation_mb', est['activation_bytes'] / 2**20, '{:.2f}')} MB</p>"
            + f"<ul><li>FLOPs per iteration {_num('flops', flops, '{:.4e}')}</li>{mfu}"
              f"<li>bytes sent per GPU per step: DP {_num('dp_bytes', dp_bytes, '{:.4e}')}, "
              f"TP {_num('tp_bytes', tp_bytes, '{:.4e}')}, PP (stage 0) {_num('pp_bytes', pp_bytes, '{:.4e}')}, "
              f"CP (ring) {_num('cp_bytes', cp_bytes, '{:.4e}')}</li>"
              f"<li>bubble {_bubble(par, b)}</li></ul>")


def planner_html(v: dict, top: int = 5) -> str:
    try:
        m, c = _model(v), cluster(v["cluster"], int(v["nodes"]))
        cps = tuple(int(x) for x in str(v.get("context_parallel_sizes", "1")).split(","))
        result = plan(m, c, int(v["global_batch_size"]), recompute=("selective", "full"),
                      context_parallel_sizes=cps, attention=v["attention"])
    except ValueError as err:
        return _error(err)
    rows = "".join(
        f"<tr><td>{r['tp']}</td><td>{r['pp']}</td><td>{r['cp']}</td><td>{r['dp']}</td><td>{r['micro_batch_size']}</td>"
        f"<td>{r['recompute']}</td><td>{r['peak_memory_gib']:.1f}</td>"
        f"<td>{_num(f'plan{i}_tokens_per_s', r['tokens_per_s'], '{:.0f}')}</td><td>{r['mfu']:.1%}</td></tr>"
        for i, r in enumerate(result["ranked"][:top]))
    why = "".join(f"<li>{html.escape(line)}</li>" for line in explain(result, c))
    return (f"<p>{_num('n_fit', len(result['ranked']))} layouts fit, {result['too_big']} do not, "
            f"{result['invalid']} break a rule (memory with {html.escape(result['attention'])} "
            f"attention).</p><table><tr><th>TP</th><th>PP</th><th>CP</th><th>DP</th>"
            f"<th>mb</th><th>recompute</th><th>GiB</th><th>tokens/s</th><th>MFU</th></tr>{rows}"
            f"</table><ul>{why}</ul>")


def calculate(name: str, values: dict) -> str:
    """The HTML answer of calculator ``name`` for ``values`` (missing values take defaults)."""
    v = {**defaults(name), **values}
    try:
        return {"batch": batch_html, "memory": memory_html, "planner": planner_html}[name](v)
    except (KeyError, TypeError, ValueError) as err:  # unparsable input: say so, no traceback
        return _error(err)

"""The PTD-P lab's capstone: predict a layout's memory and step time by hand, then confirm with the planner.

``student_fn(model, layout) -> {"params_per_gpu", "memory_gib", "flops_per_step", "step_time_s"}``
for one GPU of the **first** pipeline stage of ``layout`` (a dict: tp, pp, dp, micro_batch_size,
num_microbatches, global_batch_size, recompute "selective", sequence parallelism and Megatron's
distributed optimizer on, mixed precision with 18 bytes per parameter: 2 weights, 4 fp32 main
gradients, 12 fp32 master weights and Adam moments sharded over dp; gpu_peak_tflops and
assumed_mfu, the fraction of peak the GEMMs reach). ``model`` is a ``labkit.calc.ModelConfig``.

The judge compares each number with labkit.calc, which the student's code cannot call while it
runs (``labkit.calc.memory``, ``perf``, ``params``, ``flops`` and the planner are banned):

* ``params_per_gpu`` with ``memory_per_stage(...)[0]["num_params"]`` within 1%;
* ``memory_gib`` (weights, gradients, optimizer, activations: Korthikanti et al. 2022's 34 s b h / t
  bytes per layer with SP and selective recompute, times the layers of the stage and the
  microbatches 1F1B holds there) with ``memory_per_stage(...)[0]["total"]`` within 3%;
* ``flops_per_step`` with ``hardware_flops_per_iteration`` (model FLOPs and the recomputed
  attention, Narayanan et al. 2021 eq. 3 style) within 3%;
* ``step_time_s`` with the planner's ``step_time_s`` for the layout within 10%: FLOPs over the
  GPUs at ``assumed_mfu`` of peak, stretched by the pipeline bubble, against labkit's fitted
  step-time model (book/planning.ipynb gives its error on published runs).

Visible: the planner's winner for megatron-39b on 8 DGX A100 nodes; hidden: other layouts.
"""
from __future__ import annotations

import functools

from . import report
from .spec import Spec, call, failed, run
from .compare import far, number

KEYS = ("params_per_gpu", "memory_gib", "flops_per_step", "step_time_s")
TOLERANCE = {"params_per_gpu": 0.01, "memory_gib": 0.03, "flops_per_step": 0.03, "step_time_s": 0.10}
OWN = tuple(f"labkit.calc.{m}" for m in ("memory:memory_per_stage", "memory:peak_memory",
                                          "memory:activation_bytes_per_layer", "memory:layer_activation_bytes",
                                          "perf:step_time", "perf:step_parts", "perf:hardware_flops_per_iteration",
                                          "planner:plan", "flops:model_flops", "params:stage_params"))
WINNER = {"tp": 4, "pp": 2, "dp": 8, "micro_batch_size": 4}


def layout_of(model_name: str, nodes: int, gbs: int, tp: int, pp: int, dp: int, micro_batch_size: int) -> dict:
    """The layout dict the student's function receives."""
    return {"tp": tp, "pp": pp, "dp": dp, "micro_batch_size": micro_batch_size, "global_batch_size": gbs,
            "num_microbatches": gbs // (micro_batch_size * dp), "recompute": "selective",
            "sequence_parallel": True, "distributed_optimizer": True, "num_gpus": 8 * nodes,
            "gpu_peak_tflops": 312.0, "assumed_mfu": 0.6, "model": model_name}


def _produce(student, model="megatron-39b", nodes=8, global_batch_size=1024, layout=None):
    import labkit.calc as calc
    lay = layout_of(model, nodes, global_batch_size, **(layout or WINNER))
    m = calc.model(model)                        # a frozen dataclass: data, computed before the ban applies
    fn = student.load()["predict"]
    with student.banning(OWN, "predict by hand; the check compares with labkit.calc"):
        got, failure = call(fn, m, dict(lay))
    if failure:
        return failure
    if not isinstance(got, dict):
        return {"failed": "raised", "detail": f"returned {type(got).__name__}, not a dict with {', '.join(KEYS)}"}
    out = {}
    for k in KEYS:
        try:
            out[k] = float(got[k])
        except (KeyError, TypeError, ValueError):
            return {"failed": "raised", "detail": f"no number under {k!r} (returned keys {sorted(map(str, got))[:6]})"}
    return out


@functools.lru_cache(maxsize=8)
def _ranked(model: str, nodes: int, gbs: int):
    import labkit.calc as calc
    return calc.plan(calc.model(model), calc.cluster("dgx-a100", nodes), gbs)["ranked"]


def truth(model: str, nodes: int, gbs: int, layout: dict) -> dict:
    """labkit.calc's numbers for the layout (the judge's side)."""
    import labkit.calc as calc
    from labkit.calc.memory import memory_per_stage
    from labkit.calc.perf import hardware_flops_per_iteration
    m = calc.model(model)
    ranked = _ranked(model, nodes, gbs)
    row = next((r for r in ranked if all(r[k] == layout[k] for k in ("tp", "pp", "dp", "micro_batch_size"))
                and r["recompute"] == "selective"), None)
    if row is None:
        raise ValueError(f"the planner has no selective-recompute row for {layout}")
    st = memory_per_stage(m, row["parallel"])[0]
    return {"params_per_gpu": st["num_params"], "memory_gib": st["total"] / 2**30,
            "flops_per_step": hardware_flops_per_iteration(m, row["parallel"]), "step_time_s": row["step_time_s"]}


def _judge(data, model="megatron-39b", nodes=8, global_batch_size=1024, layout=None):
    layout = layout or WINNER
    title = (f"capstone (TP {layout['tp']} x PP {layout['pp']} x DP {layout['dp']}, "
             f"micro batch {layout['micro_batch_size']})")
    bad = failed(title, data, "call your function on the layout in the notebook and read the traceback")
    if bad is not None:
        return bad
    want = truth(model, nodes, global_batch_size, layout)
    what = {"params_per_gpu": "parameters per GPU of the first stage", "memory_gib": "memory of a first-stage GPU",
            "flops_per_step": "hardware FLOPs of one step", "step_time_s": "step time"}
    for k in KEYS:
        if far(data[k], want[k], TOLERANCE[k] * abs(want[k])):
            if number(data[k]) is None:
                return report(title, False, f"{what[k]}: your prediction is not a finite number", _HINTS[k])
            err = abs(data[k] - want[k]) / want[k]
            return report(title, False, f"{what[k]}: you predict {data[k]:.4g}, labkit.calc says {want[k]:.4g} "
                          f"({100 * err:.1f}% off; within {100 * TOLERANCE[k]:g}% passes)", _HINTS[k])
    return report(title, True, f"by hand: {data['params_per_gpu'] / 1e9:.2f} B parameters and {data['memory_gib']:.1f} "
                  f"GiB per first-stage GPU, {data['flops_per_step'] / 1e18:.3f} EFLOP and {data['step_time_s']:.1f} s "
                  f"per step; labkit.calc: {want['memory_gib']:.1f} GiB, {want['step_time_s']:.1f} s (planner)")


_HINTS = {"params_per_gpu": "a first-stage GPU holds L/p layers of 12h^2 + 13h parameters each and the word and "
                            "position embeddings, all cut t ways",
          "memory_gib": "weights 2 + gradients 4 + optimizer 12/dp bytes per parameter; activations 34 s b h / t "
                        "bytes per layer, times L/p layers, times the min(p, m) microbatches stage 0 holds",
          "flops_per_step": "6 x parameters x tokens for the GEMMs, plus the attention scores (causal: half of "
                            "12 s per token per layer per channel), plus one more forward of them (selective)",
          "step_time_s": "FLOPs / (GPUs x peak x assumed_mfu), times (1 + (p-1)/m) for the bubble"}

CAPSTONE = Spec("capstone", {"predict": "predict_layout"}, _produce, _judge, cases=({},), forbid=OWN,
                why="predict by hand; the check compares with labkit.calc", hints=(
                    "start with the parameters of one first-stage GPU; every other number follows from it",
                    _HINTS["memory_gib"], _HINTS["flops_per_step"], _HINTS["step_time_s"]))


def capstone(predict_fn, model: str = "megatron-39b", nodes: int = 8, global_batch_size: int = 1024, layout=None):
    """Compare the student's hand predictions for ``layout`` (default: the planner's winner) with labkit.calc."""
    return run(CAPSTONE, {"predict": predict_fn}, model=model, nodes=nodes, global_batch_size=global_batch_size,
               layout=dict(layout or WINNER))

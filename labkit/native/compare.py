"""Run several layouts both ways, native and labkit, in one launch per world size, and compare
them with ``labkit.reference`` (the chapter's parity and byte tables, and the tests).

    runs = run_layouts(LAYOUTS[:3], steps=5)      # {name: {"native": ..., "labkit": ..., "reference": ...}}
    rows = parity_rows(runs)                        # max |loss| and |grad| differences per layout

Each result is what ``labkit.train`` returns (losses, grad norms, reassembled gradients after
step 1, rank 0's counters), but the layouts of one world size share the processes: a launch costs
more than a tiny model's steps, so the chapter pays it once per world size and implementation.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass

from ..spec import preset_args
from .options import NativeOptions, check_native

PP = dict(pipeline_model_parallel_size=2, num_layers=4, untie_embeddings_and_output_weights=True,
          global_batch_size=8)
# the Llama family (labkit.spec's "llama3-tiny": RMSNorm, SwiGLU, RoPE, 2 K/V groups for 8 heads,
# no biases, untied), 2 layers
LLAMA = preset_args("llama3-tiny", num_layers=2)


@dataclass(frozen=True)
class Layout:
    """A named layout: the TrainConfig fields, the native options, and the fields of labkit's own
    run it is compared with (None: the same fields)."""

    name: str
    world_size: int
    config: dict
    native: NativeOptions = NativeOptions()
    labkit: dict | None = None            # fields for labkit's own run, when they differ
    note: str = ""                        # what labkit's run is, when not the same layout

    def labkit_config(self) -> dict:
        return self.config if self.labkit is None else self.labkit


LAYOUTS = [
    Layout("FSDP2 (reshard after forward)", 2, dict(zero_stage=3), note="labkit: ZeRO-3"),
    Layout("FSDP2 (no reshard)", 2, dict(zero_stage=2), note="labkit: ZeRO-2"),
    Layout("DP (FSDP2's replicate)", 2, dict(), note="labkit: DDP"),
    Layout("TP + SP + loss parallel", 2, dict(tensor_model_parallel_size=2, sequence_parallel=True)),
    Layout("Llama: TP + SP + loss parallel", 2, dict(LLAMA, tensor_model_parallel_size=2, sequence_parallel=True)),
    Layout("FSDP x TP (2-D)", 4, dict(tensor_model_parallel_size=2, sequence_parallel=True, zero_stage=3)),
    Layout("HSDP 2 x 2", 4, dict(zero_stage=3), NativeOptions(dp_replicate=2),
           note="labkit: ZeRO-3 over dp 4 (no HSDP)"),
    Layout("PP 1F1B", 2, PP, NativeOptions(schedule="1F1B")),
    Layout("PP Interleaved1F1B", 2, dict(PP, num_layers_per_virtual_pipeline_stage=1),
           NativeOptions(schedule="Interleaved1F1B")),
    Layout("PP InterleavedZeroBubble", 2, dict(PP, num_layers_per_virtual_pipeline_stage=1),
           NativeOptions(schedule="InterleavedZeroBubble"), note="labkit: interleaved 1F1B"),
    Layout("PP ZBVZeroBubble", 2, PP, NativeOptions(schedule="ZBVZeroBubble"), note="labkit: 1F1B"),
    Layout("PP DualPipeV", 2, PP, NativeOptions(schedule="DualPipeV"), note="labkit: 1F1B"),
    Layout("PP x DP x TP (ZB-V)", 8, dict(PP, tensor_model_parallel_size=2, sequence_parallel=True,
                                          global_batch_size=16),
           NativeOptions(schedule="ZBVZeroBubble"), note="labkit: 1F1B"),
]


def _many(jobs: list, steps: int, seed: int) -> list:
    """On every rank: run each (implementation, cfg, opts) in turn; this rank's results."""
    from ..training import _worker
    from .run import worker
    out = []
    for impl, cfg, opts in jobs:
        if impl == "native":
            out.append(worker(cfg, steps, seed, 0, True, opts))
        else:
            out.append(_worker(cfg, steps, seed, 0, True))
    return out


def run_layouts(layouts, steps: int = 5, seed: int = 0, dtype: str = "float64",
                implementations=("native", "labkit"), timeout: float = 600.0) -> dict:
    """{layout name: {"native"|"labkit": TrainResult-like dict, "reference": reference dict}}."""
    from ..config import train_config
    from ..launcher import launch
    from ..parallelize import assemble
    from ..reference import train_reference
    by_world: dict = {}
    for lay in layouts:
        for impl in implementations:
            fields = dict(lay.config if impl == "native" else lay.labkit_config(), params_dtype=dtype)
            cfg = train_config(**fields)
            if impl == "native":
                check_native(cfg, lay.world_size, lay.native)
            else:
                cfg.validate(lay.world_size)
            by_world.setdefault(lay.world_size, []).append((lay.name, impl, cfg, lay.native))
    runs: dict = {lay.name: {} for lay in layouts}
    for world, jobs in by_world.items():
        outs = launch(_many, world, [(impl, cfg, opts) for _, impl, cfg, opts in jobs], steps, seed,
                      backend="gloo", timeout=timeout)
        for j, (name, impl, _, _) in enumerate(jobs):
            per_rank = [o[j] for o in outs]
            r0 = per_rank[0]
            runs[name][impl] = {"losses": r0["losses"], "grad_norms": r0["grad_norms"],
                                "grads": assemble([r["grads"] for r in per_rank]),
                                "comm": [r["extra"]["comm"] for r in per_rank],
                                "comm_last_step": [r["extra"].get("comm_last_step") for r in per_rank],
                                "comm_sequence": r0["extra"].get("comm_sequence"),
                                "comm_debug": r0["extra"].get("comm_debug")}
    with one_thread():
        for lay in layouts:
            runs[lay.name]["reference"] = train_reference(world_size=lay.world_size, steps=steps, seed=seed,
                                                          capture_grads=True, params_dtype=dtype, **lay.config)
    return runs


@contextlib.contextmanager
def one_thread():
    """torch on one thread in this process for the block (as in every rank: ``launch_rank``).
    On a busy 2-core machine the tiny reference runs 20x faster so than with 2 spinning threads."""
    import torch
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)


def max_diffs(run: dict, ref: dict) -> tuple[float, float]:
    """(max |loss - reference| over the steps, max |gradient - reference| after step 1)."""
    loss = max(abs(a - b) for a, b in zip(run["losses"], ref["losses"]))
    missing = set(ref["grads"]) ^ set(run["grads"])
    if missing:
        raise ValueError(f"gradients differ in names: {sorted(missing)[:4]}")
    grad = max(float((run["grads"][n].double() - ref["grads"][n].double()).abs().max()) for n in ref["grads"])
    return loss, grad


def parity_rows(runs: dict, layouts=LAYOUTS) -> list[dict]:
    """One row per layout: ranks, then (pair, "loss" | "grad") -> max difference, for the pairs
    native-reference, labkit-reference and native-labkit; "labkit ran": what labkit's run was."""
    rows = []
    for lay in layouts:
        if lay.name not in runs:
            continue
        r = runs[lay.name]
        row = {("", "layout"): lay.name, ("", "ranks"): lay.world_size}
        for a, b in (("native", "reference"), ("labkit", "reference"), ("native", "labkit")):
            if a in r and b in r:
                row[(f"{a} - {b}", "loss")], row[(f"{a} - {b}", "grad")] = max_diffs(r[a], r[b])
        row[("", "labkit ran")] = lay.note.removeprefix("labkit: ") or "the same layout"
        rows.append(row)
    return rows


# Why native and labkit differ, per (layout, axis, collective) of the chapter's byte table
BYTE_NOTES = {
    ("FSDP2 (reshard after forward)", "dp", "all_gather"): "same bytes; 2 per unit (3 units)",
    ("FSDP2 (reshard after forward)", "dp", "reduce_scatter"): "same bytes; 1 per unit",
    ("FSDP2 (no reshard)", "dp", "all_gather"): "same bytes; 1 per unit",
    ("FSDP2 (no reshard)", "dp", "reduce_scatter"): "same bytes; 1 per unit",
    ("TP + SP + loss parallel", "tp", "all_gather"): "+ positions' grad, - t maxima",
    ("TP + SP + loss parallel", "tp", "all_reduce"): "no embedding all-reduce, no bias sums",
    ("TP + SP + loss parallel", "tp", "reduce_scatter"): "+ the embedding's (N/2)",
    ("PP 1F1B", "pp", "send"): "same; labkit adds 24 B headers",
    ("PP ZBVZeroBubble", "pp", "send"): "rank 0 holds both ends of the V",
    ("HSDP 2 x 2", "dp_shard", "all_gather"): "over 2 shards, not 4",
    ("HSDP 2 x 2", "dp_shard", "reduce_scatter"): "over 2 shards, not 4",
    ("HSDP 2 x 2", "dp_replicate", "all_reduce"): "the shard, over 2 replicas",
    ("HSDP 2 x 2", "dp", "all_gather"): "labkit: ZeRO-3 over 4",
    ("HSDP 2 x 2", "dp", "reduce_scatter"): "labkit: ZeRO-3 over 4",
}


def byte_rows(runs: dict, layouts, steps: int, why: dict = BYTE_NOTES) -> list[dict]:
    """One row per (layout, axis, collective) of rank 0: bytes and calls of one step, native counted
    and predicted (``bytes.native_step_bytes``), labkit counted and ``labkit.calc``'s prediction.
    labkit's counters hold ``steps`` identical steps; the native one is its last step (the first of
    a pipeline also infers shapes). ``why``: {(layout, axis, op): text} for the last column."""
    from ..config import train_config
    from .bytes import labkit_calc_bytes, native_step_bytes
    rows = []
    for lay in layouts:
        r = runs[lay.name]
        cfg = train_config(params_dtype="float64", **lay.config)
        native = r["native"]["comm_last_step"][0]
        predicted = native_step_bytes(cfg, lay.world_size, lay.native)
        labkit = {a: ops for a, ops in r["labkit"]["comm"][0].items() if ops} if "labkit" in r else {}
        calc = labkit_calc_bytes(train_config(params_dtype="float64", **lay.labkit_config()), lay.world_size)
        keys = sorted({(a, o) for t in (native, labkit) for a, ops in t.items() for o in ops} - {("pp", "p2p_header")})
        for axis, op in keys:
            n, lk = native.get(axis, {}).get(op), labkit.get(axis, {}).get(op)
            rows.append({"layout": lay.name, "axis": axis, "op": op.replace("_", "-"),
                         "native": _cell(n, 1), "predicted": _fmt(predicted.get(axis, {}).get(op)),
                         "labkit": _cell(lk, steps), "calc": _fmt(calc.get(axis, {}).get(op)),
                         "why": why.get((lay.name, axis, op), "")})
    return rows


def _fmt(b) -> str:
    return "-" if b is None else f"{b:,.0f}"


def _cell(c, steps: int) -> str:
    """'bytes (calls)' of one step."""
    if c is None:
        return "-"
    calls = c["calls"] / steps
    return f"{c['bytes'] / steps:,.0f} ({calls:.0f})" if calls == int(calls) else f"{c['bytes'] / steps:,.0f}"

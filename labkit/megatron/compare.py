"""Run several layouts through Megatron-Core (and labkit, for the same layout) in one launch per
world size, and judge them by ``labkit.reference`` (the tests' and the chapter's tables).

    runs = run_layouts([Layout("TP2", 2, dict(tensor_model_parallel_size=2))], steps=2)
    runs["TP2"]["megatron"]["losses"], runs["TP2"]["reference"]["grads"]

The results have the shape of ``labkit.native.compare.run_layouts``'s, so the same judge
(``labkit.native.compare.max_diffs``) compares any two of megatron, labkit and reference. A launch
costs more than a tiny model's steps (each rank imports Megatron-Core), so the layouts of one world
size share the processes: Megatron's ``parallel_state`` is built and destroyed per layout.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..native.compare import max_diffs, one_thread  # noqa: F401 - the one judge, re-exported


@dataclass(frozen=True)
class Layout:
    """A named layout: ranks, the TrainConfig fields, and options of the Megatron worker
    (``capture_params``: the weights after the last step; ``negative_control``)."""

    name: str
    world_size: int
    config: dict
    options: dict = field(default_factory=dict)


def _many(jobs: list, steps: int, seed: int) -> list:
    """On every rank: run each (implementation, cfg, options) in turn; this rank's results."""
    from ..training import _worker
    from .run import worker
    out = []
    for impl, cfg, opts in jobs:
        if impl == "megatron":
            out.append(worker(cfg, steps, seed, 0, True, **opts))
        else:
            out.append(_worker(cfg, steps, seed, 0, True))
    return out


def run_layouts(layouts, steps: int = 2, seed: int = 0, dtype: str = "float64",
                implementations=("megatron",), reference: bool = True, timeout: float = 900.0,
                backend: str = "gloo") -> dict:
    """{layout name: {"megatron" | "labkit": result, "reference": reference result}}; a result has
    losses, grad_norms, grads (dense names, after step 1), comm (rank order), params (Megatron,
    with ``capture_params``: dense names, after the last step), iteration_ms (rank 0).
    ``backend="nccl"``: one GPU per rank, Megatron as shipped (the reference stays on the CPU)."""
    from ..config import train_config
    from ..launcher import launch
    from ..parallelize import assemble
    from ..reference import train_reference
    from .options import check_megatron
    by_world: dict = {}
    for lay in layouts:
        cfg = train_config(**dict(lay.config, params_dtype=dtype))
        for impl in implementations:
            if impl == "megatron":
                check_megatron(cfg, lay.world_size)
            else:
                cfg.validate(lay.world_size)
            by_world.setdefault(lay.world_size, []).append((lay.name, impl, cfg, lay.options))
    runs: dict = {lay.name: {} for lay in layouts}
    for world, jobs in by_world.items():
        outs = launch(_many, world, [(impl, cfg, opts) for _, impl, cfg, opts in jobs], steps, seed,
                      backend=backend, timeout=timeout)
        for j, (name, impl, _, _) in enumerate(jobs):
            per_rank = [o[j] for o in outs]
            r0 = per_rank[0]
            params = [r["extra"].get("params") for r in per_rank]
            runs[name][impl] = {"losses": r0["losses"], "grad_norms": r0["grad_norms"],
                                "grads": assemble([r["grads"] for r in per_rank]),
                                "params": assemble(params) if all(p is not None for p in params) else None,
                                "comm": [r["extra"]["comm"] for r in per_rank],
                                "iteration_ms": r0["iteration_ms"]}
    if reference:
        with one_thread():
            for lay in layouts:
                runs[lay.name]["reference"] = train_reference(
                    world_size=lay.world_size, steps=steps, seed=seed, capture_grads=True,
                    return_model=True, **dict(lay.config, params_dtype=dtype))
    return runs


# the chapter's layouts ("One layout, three implementations"), 2 ranks each, GPT-2 family, float64
CHAPTER_MODEL = dict(hidden_size=32, num_attention_heads=4, seq_length=16, global_batch_size=8)
CHAPTER = [Layout("TP2+SP", 2, dict(CHAPTER_MODEL, tensor_model_parallel_size=2, sequence_parallel=True)),
           Layout("DP2", 2, dict(CHAPTER_MODEL)),
           Layout("PP2 1F1B", 2, dict(CHAPTER_MODEL, pipeline_model_parallel_size=2, num_layers=4))]


# world size 1, GPT-2 and Llama families: Megatron on one GPU (tests/test_megatron_gpu.py and
# tests/bench_gpu_extras.py); the Llama model from its preset (RMSNorm, SwiGLU, RoPE, GQA)
def world1_layouts() -> list:
    from ..config import preset_args
    return [Layout("GPT-2, world 1", 1, dict(CHAPTER_MODEL)),
            Layout("Llama, world 1", 1, dict(CHAPTER_MODEL, **preset_args("llama3-tiny", num_layers=2)))]


def summary(runs: dict, steps: int) -> dict:
    """What the chapter prints (and data/megatron_chapter.json records): per layout and
    implementation, the losses, the max |difference| from the reference (losses, gradients) and
    rank 0's bytes per step by (axis, collective); plain numbers, JSON-ready."""
    out = {}
    for name, r in runs.items():
        ref = r["reference"]
        out[name] = {}
        for impl in ("megatron", "labkit"):
            if impl not in r:
                continue
            loss, grad = max_diffs(r[impl], ref)
            comm = {f"{axis} {op}": c["bytes"] / steps for axis, ops in r[impl]["comm"][0].items()
                    for op, c in ops.items() if c["bytes"] > 0 and op != "p2p_header"}
            out[name][impl] = {"losses": r[impl]["losses"], "loss_diff": loss, "grad_diff": grad,
                               "bytes_per_step": comm}
    return out

"""Checks for the PTD-P lab: the rank grid, the bytes of a composed step, and the capstone (``capstone.py``).

``rank_grid(student_fn)``: ``student_fn(world, sizes, axis) -> [[ranks], ...]``: every group of
``axis`` ("tp", "cp", "dp", "pp", "dp_cp" or "mp") of a grid with Megatron's order tp-cp-dp-pp
(tp fastest), each group's ranks ascending; the judge compares with ``labkit.Topology`` for
several grids, while the student's code runs without it (``Topology.coords``/``groups`` banned).

``step_bytes(student_fn, layout)``: ``student_fn(shape, pp_rank) -> {"tp", "pp", "dp", "embd"}``,
the bytes a rank of pipeline rank ``pp_rank`` sends on each group in one step of a TP x PP x DP
run (no SP, no interleaving, plain DP, tied embeddings). ``shape`` holds s, b, h, L, V, t, p, d,
m, e and ``params``: {pp_rank: parameters that rank holds}. The judge runs ``labkit.train`` on the
layout in its own process and compares with what every rank counted on its groups;
``labkit.calc.composed`` is banned while the student's function runs.
"""
from __future__ import annotations

import functools

from . import report
from .spec import Spec, call, failed, run
from .compare import far, number, same

GRIDS = ({"tp": 2, "cp": 1, "dp": 2, "pp": 2}, {"tp": 4, "cp": 1, "dp": 1, "pp": 2},
         {"tp": 2, "cp": 2, "dp": 2, "pp": 1}, {"tp": 1, "cp": 2, "dp": 2, "pp": 2},
         {"tp": 2, "cp": 1, "dp": 1, "pp": 4})
AXES = ("tp", "cp", "dp", "pp", "dp_cp", "mp")
OWN_GRID = ("labkit.topology:Topology.coords", "labkit.topology:Topology.groups",
            "labkit.topology:Topology.group_of", "labkit.topology:Topology._enumerate",
            "labkit.groups:build_groups")


def _produce_grid(student, grids=GRIDS):
    fn = student.load()["groups"]
    out = []
    with student.banning(OWN_GRID, "write the arithmetic of Megatron's rank order yourself"):
        for sizes in grids:
            world = sizes["tp"] * sizes["cp"] * sizes["dp"] * sizes["pp"]
            row = {}
            for axis in AXES:
                got, failure = call(fn, world, dict(sizes), axis)
                if failure:
                    return {**failure, "detail": f"{sizes}, axis {axis}: {failure['detail']}"}
                try:
                    row[axis] = [[int(r) for r in g] for g in got]
                except (TypeError, ValueError):
                    return {"failed": "raised", "detail": f"{sizes}, axis {axis}: return a list of lists of ranks"}
            out.append(row)
    return out


def _judge_grid(data, grids=GRIDS):
    from ..topology import Topology
    name = "rank_grid"
    bad = failed(name, data, "call your function on one grid and one axis in the notebook first")
    if bad is not None:
        return bad
    if type(data) is not list or len(data) != len(grids):
        return report(name, False, f"expected the groups of {len(grids)} grids, got "
                      f"{len(data) if type(data) is list else 'a ' + type(data).__name__}")
    for sizes, got in zip(grids, data):
        topo = Topology(sizes["tp"] * sizes["cp"] * sizes["dp"] * sizes["pp"], tp=sizes["tp"], cp=sizes["cp"],
                        pp=sizes["pp"])
        for axis in AXES:
            want = sorted(sorted(g) for g in topo.groups(axis))
            mine = got[axis]
            if any(g != sorted(g) for g in mine):
                return report(name, False, f"{sizes}, axis {axis}: a group's ranks are not in ascending order "
                              f"({mine[0]})", "list each group's ranks in the order of their coordinate on the axis")
            if not same(sorted(mine), want):
                return report(name, False, f"{sizes}, axis {axis}: got {sorted(mine)[:3]}..., Megatron's groups "
                              f"are {want[:3]}...", "a group holds the ranks whose coordinates agree on every "
                              "OTHER axis; tp varies fastest, then cp, dp, pp")
    return report(name, True, f"every group of {len(AXES)} axes of {len(grids)} grids, Megatron's tp-cp-dp-pp order")


RANK_GRID = Spec("rank-grid", {"groups": "groups"}, _produce_grid, _judge_grid, cases=({},), forbid=OWN_GRID,
                 why="write the arithmetic of Megatron's rank order yourself", hints=(
                     "first write the coordinates of one rank: tp varies fastest, then cp, then dp, then pp",
                     "rank = tp_rank + tp * (cp_rank + cp * (dp_rank + dp * pp_rank)): invert it with % and //",
                     "a group of an axis: the ranks whose coordinates on every OTHER axis are equal; 'dp_cp' "
                     "varies both cp and dp, 'mp' both tp and pp"))


def rank_grid(student_fn, grids=GRIDS):
    """``student_fn(world, sizes, axis) -> groups``; print one [check] line."""
    return run(RANK_GRID, {"groups": student_fn}, grids=[dict(g) for g in grids])


# -----------------------------------------------------------------------------------------------
def layout_shape(cfg, world: int) -> dict:
    """What a bytes prediction needs: s, b, h, L, V (padded), t, p, d, m, e, params per pp rank."""
    topo = cfg.topology(world)
    return dict(s=cfg.seq_length, b=cfg.micro_batch_size, h=cfg.hidden_size, L=cfg.num_layers,
                V=cfg.model_config().vocab_size, t=topo.tp, p=topo.pp, d=topo.dp,
                m=cfg.num_microbatches(topo), e=8 if cfg.params_dtype == "float64" else 4,
                params=params_per_stage(cfg))


def _counted(res, steps: int) -> list:
    """[(pp_rank, {group: bytes per step})] of a ``labkit.train`` result, one entry per rank."""
    counted = []
    for rank in res.ranks:
        groups = {g: sum(v["bytes"] for op, v in rank["comm"].get(g, {}).items() if op != "p2p_header") / steps
                  for g in ("tp", "pp", "dp", "embd")}
        counted.append((rank["coords"]["pp"], groups))
    return counted


def params_per_stage(cfg) -> dict:
    """{pp_rank: parameters one rank of that pipeline rank holds} (its TP slice), counted on the
    real model cut as labkit.train cuts it, in one process (no communication needed)."""
    from ..model import GPT
    from ..pipeline_parallel.stage import split
    from ..tensor_parallel.plan import apply_tensor_parallel
    out = {}
    t = cfg.tensor_model_parallel_size
    for pp_rank in range(cfg.pipeline_model_parallel_size):
        model = GPT(cfg.model_config())
        chunks = split(model, cfg, pp_rank) if cfg.pipeline_model_parallel_size > 1 else [model]
        if t > 1:   # a group of t ranks that never communicates: cutting needs only rank and size
            for c in chunks:
                apply_tensor_parallel(c, _FakeGroup(t), cfg.sequence_parallel)
        out[pp_rank] = sum(p.numel() for c in chunks for p in c.parameters())
    return out


class _FakeGroup:
    """Stands for rank 0 of a tp group of ``size`` ranks, for counting shard sizes only."""

    def __init__(self, size: int):
        self.size, self.rank, self.name = size, 0, "tp"


def _produce_bytes(student, layout):
    from ..config import train_config
    fn = student.load()["predict"]
    kw = {k: v for k, v in layout.items() if k != "world_size"}
    shape = layout_shape(train_config(**kw), layout["world_size"])
    out = {}
    with student.banning(("labkit.calc.composed:labkit_step_bytes",), "derive the bytes yourself"):
        for pp_rank in range(shape["p"]):
            got, failure = call(fn, dict(shape), pp_rank)
            if failure:
                return {**failure, "detail": f"pp rank {pp_rank}: {failure['detail']}"}
            if not isinstance(got, dict):
                return {"failed": "raised", "detail": f"pp rank {pp_rank}: returned {type(got).__name__}, not a "
                        "dict of bytes per group"}
            try:
                out[str(pp_rank)] = {g: float(got.get(g, 0.0)) for g in ("tp", "pp", "dp", "embd")}
            except (TypeError, ValueError) as e:
                return {"failed": "raised", "detail": f"pp rank {pp_rank}: {e}"}
    return out


def counted(layout: dict, steps: int = 1) -> list:
    """[(pp_rank, {group: bytes per step})] of a real ``labkit.train`` run of ``layout`` (judge side;
    one run per layout in a grader's life: every submission is judged against the same one)."""
    import json
    return _counted_run(json.dumps(layout, sort_keys=True), steps)


@functools.lru_cache(maxsize=8)
def _counted_run(key: str, steps: int) -> list:
    import json
    from ..training import train
    layout = json.loads(key)
    kw = {k: v for k, v in layout.items() if k != "world_size"}
    res = train(world_size=layout["world_size"], steps=steps, log_interval=0, backend="gloo", **kw)
    return _counted(res, steps)


def _judge_bytes(data, layout):
    name = f"step_bytes ({layout.get('world_size')} ranks)"
    bad = failed(name, data, 'return {"tp": ..., "pp": ..., "dp": ..., "embd": ...}')
    if bad is not None:
        return bad
    ranks = {str(r) for r in range(layout.get("pipeline_model_parallel_size", 1))}
    if type(data) is not dict or set(data) != ranks or any(
            type(v) is not dict or set(v) - {"tp", "pp", "dp", "embd"} or any(number(x) is None for x in v.values())
            for v in data.values()):              # checked before the reference run (8 ranks)
        return report(name, False, f"expected {{pp rank: {{group: bytes}}}} for pp ranks {sorted(ranks)}, "
                      "finite numbers only", 'return {"tp": ..., "pp": ..., "dp": ..., "embd": ...}')
    rows = counted(layout)
    for pp_rank, groups in rows:
        got = data[str(pp_rank)]
        for g, expected in groups.items():
            if far(got.get(g, 0.0), expected, 0.5):
                return report(name, False, f"pp rank {pp_rank}, group {g}: predicted {got.get(g, 0.0):,.0f} bytes, "
                              f"the run sent {expected:,.0f}", "compare term by term: which collectives run on "
                              "this group, per microbatch and per step?")
    total = sum(sum(g.values()) for _, g in rows)
    return report(name, True, f"every rank, every group: {total:,.0f} bytes in all, as predicted")


LAYOUT = dict(world_size=8, num_layers=4, hidden_size=32, num_attention_heads=4, seq_length=16,
              micro_batch_size=2, global_batch_size=8, params_dtype="float64",
              tensor_model_parallel_size=2, pipeline_model_parallel_size=2)
STEP_BYTES = Spec("step-bytes", {"predict": "predict"}, _produce_bytes, _judge_bytes,
                  cases=({"layout": LAYOUT},), forbid=("labkit.calc.composed:labkit_step_bytes",),
                  why="derive the bytes yourself", hints=(
                      "group by group: which collectives run on it, per microbatch and per step?",
                      "tp: 4 all-reduces of s*b*h*e per layer per microbatch, plus the embedding's (first stage), "
                      "the output layer's and the loss's (last)",
                      "a ring all-reduce sends 2(n-1)/n of the tensor, an all-gather (n-1)/n of the gathered one; "
                      "dp: one all-reduce of the rank's parameters; embd: the tied embedding's gradient"))


def step_bytes(student_fn, layout: dict = LAYOUT):
    """Compare ``student_fn``'s bytes with a real run of ``layout`` (one step)."""
    if layout.get("sequence_parallel") or layout.get("num_layers_per_virtual_pipeline_stage"):
        raise ValueError("step_bytes covers TP x PP x DP without SP or interleaving")
    return run(STEP_BYTES, {"predict": student_fn}, layout=dict(layout))


def _specs():
    from . import capstone
    return {s.id: s for s in (RANK_GRID, STEP_BYTES, capstone.CAPSTONE)}


def hint(exercise_id: str) -> str:
    """Print the next hint of ``exercise_id`` ("rank-grid", "step-bytes", "capstone")."""
    from .hints import asker
    return asker(_specs())(exercise_id)


def __getattr__(name):
    if name == "SPECS":
        return _specs()
    if name == "capstone":
        from .capstone import capstone
        return capstone
    raise AttributeError(name)

"""Checks for the PTD-P lab: the rank grid, the bytes of a composed step, and the capstone.

``rank_grid(student_fn)``: ``student_fn(rank, tp, dp, pp) -> {"tp": i, "dp": j, "pp": k}`` in
Megatron's order (tp fastest, pp slowest); compared with the arithmetic written out here, for
several grids, while ``labkit.Topology`` is disabled.

``step_bytes(student_fn, layout)``: ``student_fn(shape, pp_rank) -> {"tp", "pp", "dp", "embd"}``,
the bytes a rank of pipeline rank ``pp_rank`` sends on each group in one step of a TP x PP x DP
run (no SP, no interleaving, plain DP, tied embeddings). ``shape`` holds s, b, h, L, V, t, p, d,
m, e and ``params``: {pp_rank: parameters that rank holds}. Compared with what ``labkit.train``
counted on its process groups (``labkit.comm``), with ``labkit.calc.composed`` disabled.

``capstone(choose_fn, predict_fn)``: ``choose_fn(model, cluster, global_batch_size) -> (tp, pp)``
must pick the planner's winner; that (tp, pp) is run on 8 CPU ranks (dp = 8 / (tp pp)), compared
with one device (losses and every gradient, float64), and ``predict_fn`` must explain its bytes.
"""
from __future__ import annotations

from . import forbidden, hint, report

GRIDS = [(2, 2, 2), (4, 1, 2), (2, 4, 1), (1, 2, 4), (8, 1, 1), (2, 1, 4)]


def rank_grid(student_fn):
    name = "rank_grid"
    with forbidden("labkit.topology:Topology.coords", "labkit.topology:Topology.groups",
                   why="write the arithmetic of Megatron's rank order yourself"):
        for tp, dp, pp in GRIDS:
            for rank in range(tp * dp * pp):
                expected = {"tp": rank % tp, "dp": (rank // tp) % dp, "pp": rank // (tp * dp)}
                try:
                    got = dict(student_fn(rank, tp, dp, pp))
                except Exception as e:  # noqa: BLE001 - the student's error is the message
                    return report(name, False, f"tp {tp} dp {dp} pp {pp}, rank {rank}: raised "
                                  f"{type(e).__name__}: {e}", "run the function on one rank first")
                wrong = sorted(k for k in expected if got.get(k) != expected[k])
                if wrong:
                    return report(name, False, f"tp {tp} x dp {dp} x pp {pp}, rank {rank}: the "
                                  f"{' and '.join(wrong)} coordinate"
                                  f"{'s differ' if len(wrong) > 1 else ' differs'}", hint(name, student_fn, [
                                      "tp varies fastest, then dp, then pp",
                                      "rank = tp_rank + tp * (dp_rank + dp * pp_rank): invert it",
                                      "tp_rank = rank % tp, then divide by tp and repeat with dp"]))
    return report(name, True, f"every rank of {len(GRIDS)} grids, Megatron's tp-dp-pp order")


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


def _try(name, student_fn, shape):
    """Call the prediction for every pipeline rank before anything runs: a stub fails at once."""
    for pp_rank in range(shape["p"]):
        try:
            got = student_fn(dict(shape), pp_rank)
        except Exception as e:  # noqa: BLE001
            return report(name, False, f"pp rank {pp_rank}: raised {type(e).__name__}: {e}",
                          "call your function with the shape dict and 0 first")
        if not isinstance(got, dict):
            return report(name, False, f"pp rank {pp_rank}: returned {got!r}, not a dict of bytes per group",
                          'return {"tp": ..., "pp": ..., "dp": ..., "embd": ...}')
    return None


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


def _compare(name, student_fn, shape, counted) -> object | None:
    for pp_rank, groups in counted:
        got = dict(student_fn(dict(shape), pp_rank))
        for g, expected in groups.items():
            if abs(float(got.get(g, 0.0)) - expected) > 0.5:
                return report(name, False, f"pp rank {pp_rank}, group {g}: predicted "
                              f"{float(got.get(g, 0.0)):,.0f} bytes, the run sent {expected:,.0f}",
                              hint(name, student_fn, [
                                  "compare term by term: which collectives run on this group, per "
                                  "microbatch and per step?",
                                  "tp: 4 all-reduces of s*b*h*e per layer per microbatch, plus the "
                                  "embedding's (first stage), the output layer's and the loss's (last)",
                                  "ring all-reduce sends 2(n-1)/n of the tensor; all-gather (n-1)/n "
                                  "of the gathered one; dp: one all-reduce of the rank's parameters"],
                                  kind=g))
    return None


def step_bytes(student_fn, layout: dict):
    """Compare ``student_fn``'s bytes with a real run of ``layout`` (one step)."""
    name = f"step_bytes ({layout.get('world_size')} ranks)"
    if layout.get("sequence_parallel") or layout.get("num_layers_per_virtual_pipeline_stage"):
        raise ValueError("step_bytes covers TP x PP x DP without SP or interleaving")
    from ..config import train_config
    from ..training import train
    kw = {k: v for k, v in layout.items() if k != "world_size"}
    shape = layout_shape(train_config(**kw), layout["world_size"])
    with forbidden("labkit.calc.composed:labkit_step_bytes", why="derive the bytes yourself"):
        failed = _try(name, student_fn, shape)
    if failed is not None:
        return failed
    res = train(world_size=layout["world_size"], steps=1, log_interval=0, backend="gloo", **kw)
    counted = _counted(res, 1)
    with forbidden("labkit.calc.composed:labkit_step_bytes", why="derive the bytes yourself"):
        failed = _compare(name, student_fn, shape, counted)
    if failed is not None:
        return failed
    total = sum(sum(g.values()) for _, g in counted)
    return report(name, True, f"every rank, every group: {total:,.0f} bytes in all, as predicted")


def capstone(choose_fn, predict_fn, model: str = "megatron-39b", nodes: int = 8,
             global_batch_size: int = 1024):
    """Choose with the planner, run the choice on 8 ranks, prove parity, explain the bytes."""
    import labkit.calc as calc

    from ..measure.ptdp import composed_run
    name = "capstone"
    m, cl = calc.model(model), calc.cluster("dgx-a100", nodes)
    best = calc.plan(m, cl, global_batch_size)["ranked"][0]
    try:
        tp, pp = choose_fn(m, cl, global_batch_size)
    except Exception as e:  # noqa: BLE001
        return report(name, False, f"choose raised {type(e).__name__}: {e}", "call calc.plan first")
    if (tp, pp) != (best["tp"], best["pp"]):
        return report(name, False, f"chose TP {tp} x PP {pp}; the planner's winner is another layout",
                      hint(name, choose_fn, ["the winner is the first row of calc.plan(...)['ranked']",
                                             "read its 'tp' and 'pp'"]))
    if 8 % (tp * pp):
        return report(name, False, f"TP {tp} x PP {pp} does not fit 8 ranks", "pick tp * pp dividing 8")
    layout = dict(num_layers=2 * pp, hidden_size=32, num_attention_heads=max(4, tp), seq_length=16,
                  micro_batch_size=2, global_batch_size=8, params_dtype="float64",
                  tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp)
    steps = 3
    from ..config import train_config
    shape = layout_shape(train_config(**layout), 8)
    with forbidden("labkit.calc.composed:labkit_step_bytes", why="derive the bytes yourself"):
        failed = _try(name, predict_fn, shape)
    if failed is not None:
        return failed
    run = composed_run(8, steps=steps, **layout)
    if run["max_loss_diff"] > 1e-12 or run["max_grad_diff"] > 1e-12:
        return report(name, False, f"the composed run differs from one device: losses by "
                      f"{run['max_loss_diff']:.1e}, gradients by {run['max_grad_diff']:.1e}",
                      "this is labkit's side, not yours: report it")
    counted = _counted(run["result"], steps)
    with forbidden("labkit.calc.composed:labkit_step_bytes", why="derive the bytes yourself"):
        failed = _compare(name, predict_fn, shape, counted)
    if failed is not None:
        return failed
    return report(name, True, f"the planner's TP {tp} x PP {pp} for {model} on {nodes} DGX A100 nodes, "
                  f"run as TP {tp} x PP {pp} x DP {8 // (tp * pp)} on 8 ranks: losses and every "
                  f"gradient equal one device (<= 1e-12), every byte predicted")

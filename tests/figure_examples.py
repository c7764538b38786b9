"""Inputs for the book's figure functions (labkit/figures/*.py) that draw measured runs: the same
shapes the chapters pass, computed here in one process (by definition, or from labkit's pure
code) so that tests/test_figures_book.py can draw every figure in seconds. Figures that need no
input (they compute from schedules, Topology, calc) are called with their defaults."""
from __future__ import annotations

WORLD = 4


def collectives_per_rank(world: int = WORLD) -> list:
    """What each collective leaves on each rank, by definition: per_rank[r][op] = (x, tag, y, ytag)."""
    import torch
    xs = [torch.arange(4.0) + 10 * r for r in range(world)]
    tags = [torch.full((4,), 2.0 ** r) for r in range(world)]

    def ops(v):
        total = sum(v)
        return {"all_reduce": [total] * world,
                "reduce_scatter": [total[r:r + 1] for r in range(world)],
                "all_gather": [torch.stack([t[0] for t in v])] * world,
                "all_to_all": [torch.stack([t[r] for t in v]) for r in range(world)],
                "broadcast": [v[0]] * world,
                "send_recv": [v[(r - 1) % world] for r in range(world)]}
    ys, ytags = ops(xs), ops(tags)
    out = [{} for _ in range(world)]
    for op in ys:
        for r in range(world):
            inp = (xs[r][:1], tags[r][:1]) if op == "all_gather" else (xs[r], tags[r])
            out[r][op] = (*inp, ys[op][r], ytags[op][r])
    return out


def ring_states(world: int = WORLD) -> list:
    """The chapter's ring all-reduce, every rank simulated in a loop: states[r][step]."""
    import torch
    val = [list((torch.arange(4.0) + 10 * r).chunk(world)) for r in range(world)]
    tag = [list(torch.full((4,), 2.0 ** r).chunk(world)) for r in range(world)]
    states = [[(torch.cat(val[r]), torch.cat(tag[r]), None)] for r in range(world)]
    for phase in ("rs", "ag"):
        for k in range(world - 1):
            sent = []
            for r in range(world):
                s = (r - k) % world if phase == "rs" else (r + 1 - k) % world
                sent.append((val[r][s], tag[r][s]))
            for r in range(world):
                t = (r - k - 1) % world if phase == "rs" else (r - k) % world
                gv, gt = sent[(r - 1) % world]
                if phase == "rs":
                    val[r][t], tag[r][t] = val[r][t] + gv, tag[r][t] + gt
                else:
                    val[r][t], tag[r][t] = gv, gt
                states[r].append((torch.cat(val[r]), torch.cat(tag[r]), t))
    return states


def cluster_rows() -> list:
    return [{"cluster": "Selene, DGX A100 (paper)", "TP on NVLink s": 0.75, "TP on IB s": 9.0,
             "DP on IB s": 0.36, "compute s": 6.0},
            {"cluster": "DGX-2, V100 (BigScience's figures)", "TP on NVLink s": 1.5,
             "TP on IB s": 36.1, "DP on IB s": 1.43, "compute s": 15.0}]


def overlap_out() -> dict:
    """The shape of ``measure.dp.overlap_worker``'s result, times in ms; the bucketed run ends later
    than the naive one here, so a clipped x-range would show."""
    phases = lambda end: [("forward", 0.0, 20.0), ("backward", 20.0, end - 20), ("wait for grads",
                          end - 20, end - 5), ("optimizer", end - 5, end)]
    return {"naive": {"phases": phases(90.0), "all_reduce": [("p0", 70.0 + i, 71.0 + i) for i in range(4)]},
            "bucketed": {"phases": phases(120.0),
                         "all_reduce": [(f"b{i}", 30.0 + 20 * i, 45.0 + 20 * i) for i in range(4)]}}


def zero_held() -> dict:
    """``measure.dp.memory_worker``'s bytes as the chapter measured them (= labkit.calc)."""
    from labkit.calc.memory import zero_memory_per_rank
    return {(stage, dp): dict(zero_memory_per_rank(21472, dp, stage), num_params=21472)
            for stage in range(4) for dp in (1, 2, 4, 8)}


def sp_comm() -> dict:
    """Rank 0's bytes in the chapter's block_parity runs (TP 2, float64, s=16, b=2, h=32)."""
    return {"TP 2": {"all_reduce": {"bytes": 32768.0, "calls": 4}},
            "TP 2 + SP": {"all_gather": {"bytes": 16384.0, "calls": 4},
                          "reduce_scatter": {"bytes": 16384.0, "calls": 4}},
            "TP 2 + SP re-gather": {"all_gather": {"bytes": 24576.0, "calls": 6},
                                    "reduce_scatter": {"bytes": 16384.0, "calls": 4}}}


def cp_balance(cp: int = 4) -> dict:
    """``work_balance``'s shape: FLOPs proportional to the chunk blocks each rank computes."""
    from labkit.figures.context_parallel import _work
    return {layout: [{"flops": 1e8 * w, "seconds": 0.0} for w in _work(cp, layout)]
            for layout in ("contiguous", "balanced")}


def composed_bytes() -> list:
    """Rows of ``measure.ptdp.composed_run(...)["bytes"]`` as the chapter stores them (ranks 0, 7)."""
    rows = []
    for rank, vals in ((0, {("tp", "all_gather"): 73728.0, ("tp", "reduce_scatter"): 65536.0,
                            ("pp", "send"): 24576.0, ("dp", "all_gather"): 70016.0,
                            ("embd", "all_reduce"): 32768.0}),
                       (7, {("tp", "all_gather"): 74240.0, ("pp", "send"): 24576.0,
                            ("dp", "reduce_scatter"): 68224.0})):
        for (g, op), v in vals.items():
            rows.append({"rank": rank, "group": g, "op": op, "counted": v, "labkit.calc": v})
    return rows


def strategy_ratios() -> tuple:
    gpu = {"baseline": [1.0], "DP2": [1.0, 1.0], "TP2": [1.07, 1.07], "PP2": [0.76, 1.10]}
    cpu = {"baseline": [1.0], "DP2": [1.0, 1.0], "TP2": [0.94, 0.94], "PP2": [0.78, 0.86]}
    return gpu, cpu


def routing_maps() -> list:
    """The chapter's routing: two ranks, six tokens each, top-1 of four experts."""
    import torch
    gen = torch.Generator().manual_seed(2)
    return [torch.zeros(6, 4, dtype=torch.bool).scatter(
        1, torch.randn(6, 4, generator=gen).argmax(1, keepdim=True), True) for _ in range(2)]


def load_runs() -> dict:
    """Tokens per expert over 40 steps, collapsing without the aux loss and even with it."""
    collapse = [[64 + 4 * s, 64 + 3 * s, 64, 64, 64 - 2 * s, 64 - s, 64 - 2 * s, 64 - 2 * s]
                for s in range(40)]
    return {"moe_aux_loss_coeff = 0.0": {"tokens_per_expert": collapse},
            "moe_aux_loss_coeff = 0.3": {"tokens_per_expert": [[64] * 8 for _ in range(40)]}}


def drop_rows() -> list:
    return [{"capacity_factor": f, "dropped": d, "balanced_prediction": max(0.0, 1 - f)}
            for f, d in ((0.5, 0.52), (1.0, 0.18), (1.5, 0.06), (2.0, 0.01))]


def stage_memory() -> tuple:
    """labkit.calc's memory per stage of GPT-2 large on PP 2, and the GiB the H200s measured."""
    import labkit.calc as calc
    par = calc.ParallelConfig(world_size=2, pipeline_model_parallel_size=2, micro_batch_size=64,
                              global_batch_size=64)
    return calc.memory_per_stage(calc.model("gpt2-774m"), par), [59.8, 86.2]


EXAMPLES = {
    "collectives.fig_collectives": lambda m: m.fig_collectives(collectives_per_rank()),
    "collectives.fig_ring_steps": lambda m: m.fig_ring_steps(ring_states()),
    "collectives.fig_cluster_times": lambda m: m.fig_cluster_times(cluster_rows()),
    "sequence_parallel.fig_sp_bytes": lambda m: m.fig_sp_bytes(sp_comm()),
    "context_parallel.fig_balance": lambda m: m.fig_balance(cp_balance()),
    "context_parallel.fig_cp_table": lambda m: m.fig_cp_table(__import__("labkit.measure.cp_table",
                                                                          fromlist=["compare"]).compare()),
    "ptdp.fig_composed_bytes": lambda m: m.fig_composed_bytes(composed_bytes()),
    "ptdp.fig_strategy_memory": lambda m: m.fig_strategy_memory(*strategy_ratios()),
    "expert_parallel.fig_dispatch": lambda m: m.fig_dispatch(routing_maps(), 4),
    "expert_parallel.fig_load_balance": lambda m: m.fig_load_balance(load_runs()),
    "expert_parallel.fig_drops": lambda m: m.fig_drops(drop_rows()),
    "pipeline.fig_stage_memory": lambda m: m.fig_stage_memory(*stage_memory()),
    "data_parallel.fig_overlap": lambda m: m.fig_overlap(overlap_out()),
    "data_parallel.fig_zero_memory": lambda m: m.fig_zero_memory(zero_held()),
}

"""Tier 1 (no processes): pipeline schedules as data - labkit.pipeline_parallel.schedules, .simulate, .plot.

What must hold (chapters "Pipeline parallelism", "Interleaved pipeline"):
* validate() passes for GPipe, 1F1B, interleaved and ZB-H1 over a grid of (p, v, m);
* warm-up lengths equal the formulas (1F1B: min(p-r-1, m); interleaved: min(2(p-r-1)+(v-1)p, mv));
* with equal costs the simulated bubble equals (p-1)/m, and (p-1)/(vm) interleaved;
* peak in-flight microbatches: m for GPipe, at most p (p - r on rank r) for 1F1B;
* validate() rejects broken schedules (missing, repeated, out of order, deadlock).
"""
import itertools

import pytest

from labkit.config import TrainConfig
from labkit.pipeline_parallel import schedules as S
from labkit.pipeline_parallel.plot import render
from labkit.pipeline_parallel.schedules import Action
from labkit.pipeline_parallel.simulate import peak_in_flight, simulate, validate

GRID_PM = [(p, m) for p in (1, 2, 3, 4, 8) for m in (1, 2, 3, 4, 8, 16)]
GRID_PVM = [(p, v, m) for p in (1, 2, 3, 4, 8) for v in (1, 2, 3, 4) for m in (p, 2 * p, 4 * p)]


def forwards_before_first_backward(actions) -> int:
    """= warm-up + 1 (the steady state opens with a forward), or all forwards if none is left."""
    return next(i for i, a in enumerate(actions) if a.kind != "F")


@pytest.mark.parametrize("p,m", GRID_PM)
def test_gpipe_valid_bubble_and_memory(p, m):
    sched = S.gpipe(p, m)
    assert validate(sched) == (p, 1, m)
    sim = simulate(sched, forward=1.0, backward=2.0)
    assert sim.bubble_fraction == pytest.approx((p - 1) / m, abs=1e-12)
    assert sim.peak_in_flight == [m] * p


@pytest.mark.parametrize("p,m", GRID_PM)
def test_1f1b_valid_warmup_bubble_and_memory(p, m):
    sched = S.one_f_one_b(p, m)
    assert validate(sched) == (p, 1, m)
    for r, acts in enumerate(sched):
        assert S.warmup_1f1b(p, r, m) == min(p - r - 1, m)
        assert forwards_before_first_backward(acts) == min(S.warmup_1f1b(p, r, m) + 1, m)
    sim = simulate(sched, forward=1.0, backward=2.0)
    assert sim.bubble_fraction == pytest.approx((p - 1) / m, abs=1e-12)
    assert sim.peak_in_flight == [min(p - r, m) for r in range(p)]
    assert max(sim.peak_in_flight) <= p


@pytest.mark.parametrize("p,v,m", GRID_PVM)
def test_interleaved_valid_warmup_and_bubble(p, v, m):
    sched = S.interleaved(p, v, m)
    assert validate(sched) == (p, v, m)
    for r, acts in enumerate(sched):
        w = S.warmup_interleaved(p, v, r, m) if v > 1 else S.warmup_1f1b(p, r, m)  # v=1: 1F1B
        assert S.warmup_interleaved(p, v, r, m) == min(2 * (p - r - 1) + (v - 1) * p, m * v)
        assert forwards_before_first_backward(acts) == min(w + 1, m * v)
    sim = simulate(sched, forward=1.0, backward=2.0)
    assert sim.bubble_fraction == pytest.approx((p - 1) / (v * m), abs=1e-12)
    assert sim.bubble_fraction == pytest.approx(S.bubble_formula(p, m, v), abs=1e-12)


def test_interleaved_with_one_chunk_is_1f1b():
    assert S.interleaved(4, 1, 8) == S.one_f_one_b(4, 8)


def test_interleaved_chunk_order_is_megatrons():
    # p=2, v=2, m=4 rank 0: chunk 0 runs mb 0,1, then chunk 1 runs mb 0,1, then chunk 0 mb 2,3 ...
    acts = S.interleaved(2, 2, 4)[0]
    fwd = [(a.microbatch, a.chunk) for a in acts if a.kind == "F"]
    assert fwd == [(0, 0), (1, 0), (0, 1), (1, 1), (2, 0), (3, 0), (2, 1), (3, 1)]
    bwd = [(a.microbatch, a.chunk) for a in acts if a.kind == "B"]
    assert bwd[:4] == [(0, 1), (1, 1), (0, 0), (1, 0)]  # last chunk first


@pytest.mark.parametrize("p,m", [(p, m) for p in (2, 3, 4, 8) for m in (p, 2 * p, 4 * p)])
def test_zb_h1_valid_smaller_bubble_same_peak(p, m):
    sched = S.zb_h1(p, m)
    validate(sched)
    assert all(sum(a.kind == "W" for a in acts) == m for acts in sched)
    sim = simulate(sched, forward=1.0, backward=2.0, weight=1.0)     # F = B = W = 1
    one = simulate(S.one_f_one_b(p, m), forward=1.0, backward=2.0)
    assert sim.bubble_fraction == pytest.approx((p - 1) / (3 * m), abs=1e-12)
    assert sim.bubble_fraction == pytest.approx(one.bubble_fraction / 3, abs=1e-12)
    assert max(sim.peak_in_flight) <= p


def test_bubble_shrinks_with_more_microbatches_and_chunks():
    b = [simulate(S.one_f_one_b(4, m)).bubble_fraction for m in (4, 8, 16, 32)]
    assert b == sorted(b, reverse=True) and b[-1] < b[0] / 7
    assert simulate(S.interleaved(4, 2, 8)).bubble_fraction < simulate(S.one_f_one_b(4, 8)).bubble_fraction


def test_communication_cost_is_added_per_hop():
    """A p2p latency c delays 1F1B's single microbatch by 2(p-1) hops (forward and backward)."""
    for p in (2, 4):
        free, slow = (simulate(S.one_f_one_b(p, 1), comm=c).makespan for c in (0.0, 0.5))
        assert slow - free == pytest.approx(2 * (p - 1) * 0.5)


@pytest.mark.parametrize("p,m", [(1, 1), (2, 4), (4, 8)])
def test_peak_in_flight_matches_simulation(p, m):
    for sched in (S.gpipe(p, m), S.one_f_one_b(p, m)):
        assert simulate(sched).peak_in_flight == [peak_in_flight(a) for a in sched]


# --- broken schedules are rejected, naming what is wrong -------------------------------------
def test_validate_rejects_missing_and_repeated():
    sched = S.one_f_one_b(2, 4)
    broken = [sched[0][:-1], sched[1]]  # rank 0 drops its last backward
    with pytest.raises(ValueError, match="rank 0.*missing \\['B3'\\]"):
        validate(broken)
    with pytest.raises(ValueError, match="repeated \\['F1'\\]"):
        validate([sched[0] + [Action("F", 1)], sched[1]])


def test_validate_rejects_backward_before_forward():
    sched = S.one_f_one_b(2, 2)
    acts = list(sched[1])
    acts[0], acts[1] = acts[1], acts[0]  # B0 before F0 on the last rank
    with pytest.raises(ValueError, match="comes before F0"):
        validate([sched[0], acts])


def test_validate_detects_deadlock():
    # rank 0 waits for B0's gradient before sending F1; rank 1 waits for F1 before running B0
    bad = [[S.F(0), S.B(0), S.F(1), S.B(1)], [S.F(0), S.F(1), S.B(0), S.B(1)]]
    with pytest.raises(ValueError, match="deadlock.*0: 'B0', 1: 'F1'"):
        validate(bad)
    validate([[S.F(0), S.F(1), S.B(0), S.B(1)], [S.F(0), S.B(0), S.F(1), S.B(1)]])  # 1F1B's order


def test_bad_sizes_raise():
    with pytest.raises(ValueError, match="m 6 % p 4"):
        S.interleaved(4, 2, 6)
    with pytest.raises(ValueError, match="positive integer"):
        S.one_f_one_b(0, 4)
    with pytest.raises(ValueError, match="kind"):
        Action("X", 0)


@pytest.mark.parametrize("layers,pp,per,err", [
    (6, 4, None, "num_layers"),
    (8, 2, 3, "layers per virtual stage; 4 % 3"),
])
def test_layout_rules(layers, pp, per, err):
    """The pipeline layout rules live in the one rule book (labkit.calc.config via labkit.config)."""
    cfg = TrainConfig(num_layers=layers, pipeline_model_parallel_size=pp, micro_batch_size=1,
                      global_batch_size=2 * pp, num_layers_per_virtual_pipeline_stage=per)
    with pytest.raises(ValueError, match=err):
        cfg.validate(pp)


def test_layout_counts():
    v = [TrainConfig(num_layers=8, pipeline_model_parallel_size=2, num_layers_per_virtual_pipeline_stage=k)
         .virtual_pipeline_size() for k in (None, 2, 1)]
    assert v == [1, 2, 4]


def test_render_draws_one_box_per_action():
    import matplotlib
    matplotlib.use("Agg")
    sim = simulate(S.interleaved(2, 2, 4))
    fig = render(sim, title="interleaved")
    boxes = sum(len(c.get_paths()) for c in fig.axes[0].collections)
    assert boxes == sum(len(a) for a in S.interleaved(2, 2, 4))
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == ["rank 0", "rank 1"]


def test_validate_grid_summary():
    """The grid the chapter's closing note reports: every schedule validates."""
    n = 0
    for (p, m) in itertools.product((1, 2, 3, 4, 8), (1, 2, 4, 8, 16)):
        validate(S.gpipe(p, m)); validate(S.one_f_one_b(p, m)); validate(S.zb_h1(p, m))
        n += 3
        for v in (2, 3, 4):
            if m % p == 0:
                validate(S.interleaved(p, v, m)); n += 1
    assert n > 100


def test_public_api_names_and_signatures():
    """The book and external checks call these names; keep them (issue 6)."""
    import inspect
    assert list(inspect.signature(S.gpipe).parameters) == ["p", "m"]
    assert list(inspect.signature(S.one_f_one_b).parameters) == ["p", "m"]
    assert list(inspect.signature(S.interleaved).parameters) == ["p", "v", "m"]
    a = S.interleaved(2, 2, 2)[1][0]
    assert (a.kind, a.microbatch, a.chunk) == ("F", 0, 0)
    assert {x.kind for x in S.zb_h1(2, 2)[0]} == {"F", "B", "W"}
    assert all(x.chunk == 0 for x in S.one_f_one_b(3, 3)[0])

"""Checks for the Pipeline-parallelism lab: a 1F1B action list, and a predicted bubble.

``one_f_one_b(student_fn)``: ``student_fn(p, m, rank) -> list[Action]``. The check builds the
whole schedule from it for several (p, m), validates it (every F and B once, F before B, no
deadlock), simulates it (bubble (p-1)/m, at most p - rank microbatches held), then runs it for
real on gloo ranks and compares every stage's gradients with the dense GPT's.

``bubble(prediction, schedule)``: the student predicts the bubble fraction of a schedule (idle
over busy, equal stage costs, backward = 2 x forward) before the simulator says it.
"""
from __future__ import annotations

from . import describe_mismatch, report


def _build(student_fn, p, m):
    return [list(student_fn(p, m, r)) for r in range(p)]


def one_f_one_b(student_fn, sizes=((2, 4), (4, 8), (3, 2), (4, 1)), run_p: int = 2, run_m: int = 4):
    """Validate, simulate and run the student's 1F1B; print one [check] line."""
    from ..pipeline_parallel.simulate import simulate, validate
    name = "one_f_one_b"
    for p, m in sizes:
        try:
            sched = _build(student_fn, p, m)
            validate(sched)
        except Exception as e:  # noqa: BLE001 - any error is the student's to see
            return report(f"{name} (p={p}, m={m})", False, f"{type(e).__name__}: {e}",
                          "each rank: warm-up of min(p-rank-1, m) forwards, then pairs F, B, "
                          "then the remaining backwards")
        sim = simulate(sched)
        for r in range(p):
            if sim.peak_in_flight[r] > min(p - r, m):
                return report(f"{name} (p={p}, m={m})", False,
                              f"rank {r} holds {sim.peak_in_flight[r]} microbatches at once; 1F1B "
                              f"holds at most min(p - rank, m) = {min(p - r, m)}",
                              "start the backwards earlier: the warm-up is min(p - rank - 1, m)")
        if abs(sim.bubble_fraction - (p - 1) / m) > 1e-9:
            return report(f"{name} (p={p}, m={m})", False,
                          f"simulated bubble {sim.bubble_fraction:.4f}, 1F1B's is (p-1)/m = "
                          f"{(p - 1) / m:.4f}", "do not wait longer than needed between F and B")
    return _run(name, _build(student_fn, run_p, run_m), sizes)


def _run(name, sched, sizes):
    """Run ``sched`` on its ranks in float64 and compare gradients with the dense model."""
    from ..launcher import LaunchTimeout, RankFailed
    from ..measure.pipeline import measure
    p, m = len(sched), 1 + max(a.microbatch for a in sched[0])
    try:
        run = measure(sched, hidden_size=32, seq_length=16, micro_batch_size=2, iterations=1,
                      return_grads=True, params_dtype="float64", timeout=60.0)
    except (RankFailed, LaunchTimeout) as e:
        return report(name, False, f"running it failed: {str(e).splitlines()[0]}",
                      "a rank waits for a message that is never sent: check the order")
    ref = _dense_grads(p, m)
    for r, grads in enumerate(run.grads):
        for pname, g in grads.items():
            problem = describe_mismatch(g, ref[pname], atol=1e-12, rtol=1e-12,
                                        what=f"rank {r} {pname} ")
            if problem:
                return report(name, False, problem, "each microbatch needs exactly one F and one B")
    grid = ", ".join(f"p={p_} m={m_}" for p_, m_ in sizes)
    return report(name, True, f"valid, bubble (p-1)/m and at most p - rank microbatches held for "
                  f"{grid}; run on {p} ranks, gradients equal the dense model's")


def _dense_grads(p, m):
    from .. import data
    from ..model import GPT, GPTConfig
    model = GPT(GPTConfig(num_layers=p, hidden_size=32, num_attention_heads=4, seq_length=16),
                seed=0).double()
    inputs, labels = data.get_batch(data.load_tokens(), 0, 2 * m, 16, 0)
    model.loss(inputs, labels).backward()
    return {n: prm.grad for n, prm in model.named_parameters()}


def bubble(prediction: float, schedule, name: str = "bubble") -> object:
    """Compare a predicted bubble fraction with the simulated one (equal costs, B = 2F)."""
    from ..pipeline_parallel.simulate import simulate, validate
    p, v, m = validate(schedule)
    got = simulate(schedule).bubble_fraction
    if prediction is None:
        return report(name, False, "no prediction given", "replace None by a number")
    if abs(float(prediction) - got) > 1e-3:
        return report(name, False, f"predicted {float(prediction):.4f}, the simulator says "
                      f"{got:.4f} for p={p}, v={v}, m={m}",
                      "bubble = idle / busy = (p - 1) / (v * m) for the 1F1B family")
    return report(name, True, f"{got:.4f} for p={p}, v={v}, m={m}: (p-1)/(v m) = "
                  f"{p - 1}/({v}*{m})")

"""Checks for the Pipeline-parallelism and Interleaved-pipeline labs.

``one_f_one_b(student_fn)``: ``student_fn(p, m, rank) -> list[Action]``. The check builds the
whole schedule from it for several (p, m), validates it (every F and B once, F before B, no
deadlock), simulates it (bubble (p-1)/m, at most p - rank microbatches held: Narayanan et al.
2021, Sec. 2.2.1), then runs it for real on gloo ranks and compares every stage's gradients with
the dense GPT's.

``interleaved(student_fn)``: ``student_fn(p, v, m, rank) -> list[Action]`` with chunks. The same,
against the interleaved schedule's bubble (p-1)/(v m) (Sec. 2.2.2) and Megatron's warm-up, which
sets how many chunk-microbatches a rank holds: ``min(2(p-r-1) + (v-1)p + 1, m v)``
(``get_pp_rank_microbatches`` in ``megatron/core/pipeline_parallel/schedules.py``, d98e8a64, with
the default microbatch group size p); and its point-to-point messages must batch into NCCL-safe
steps (``labkit.pipeline_parallel.p2p_plan``).

labkit's own schedules (``labkit.pipeline_parallel.schedules``) raise while the student's function
runs. ``bubble`` and ``p2p_messages`` check a number the student predicts before measuring it.
"""
from __future__ import annotations

from . import describe_mismatch, forbidden, hint, report

SCHED = "labkit.pipeline_parallel.schedules"
OWN_SCHEDULES = tuple(f"{SCHED}:{n}" for n in ("gpipe", "one_f_one_b", "warmup_1f1b", "interleaved",
                                                "warmup_interleaved", "_virtual_mb", "zb_h1"))


def _build(student_fn, *shape):
    with forbidden(*OWN_SCHEDULES, why="the schedule is the exercise"):
        return [list(student_fn(*shape, r)) for r in range(shape[0])]


def _try(check, title, student_fn, build, levels):
    """(schedule, None) or (None, failed CheckResult) when building or validating it fails."""
    from ..pipeline_parallel.simulate import validate
    from . import Forbidden
    try:
        sched = build()
        validate(sched)
        return sched, None
    except Forbidden as e:
        return None, report(title, False, f"your function called labkit's own implementation: {e}",
                            "build the action list yourself, with Action(kind, microbatch, chunk)")
    except NotImplementedError as e:
        return None, report(title, False, f"your code raised NotImplementedError: {e}",
                            "the exercise is not written yet: replace the raise by your code")
    except Exception as e:  # noqa: BLE001 - any error is the student's to see
        return None, report(title, False, f"{type(e).__name__}: {e}", hint(check, student_fn, levels, "invalid"))


def one_f_one_b(student_fn, sizes=((2, 4), (4, 8), (3, 2), (4, 1)), run_p: int = 2, run_m: int = 4):
    """Validate, simulate and run the student's 1F1B; print one [check] line."""
    from ..pipeline_parallel.simulate import simulate
    name = "one_f_one_b"
    for p, m in sizes:
        title = f"{name} (p={p}, m={m})"
        sched, failed = _try(name, title, student_fn, lambda: _build(student_fn, p, m), [
            "the schedule cannot run: read the message (which microbatch, which rank)",
            "each rank: a warm-up of forwards, then pairs F, B, then the remaining backwards; every "
            "microbatch once forward and once backward, each F before its B",
            "warm-up = min(p - rank - 1, m) forwards, then m - warm-up pairs (F of the next "
            "microbatch, B of the oldest), then the warm-up's backwards"])
        if failed is not None:
            return failed
        sim = simulate(sched)
        for r in range(p):
            if sim.peak_in_flight[r] > min(p - r, m):
                return report(title, False, f"rank {r} holds {sim.peak_in_flight[r]} microbatches at once; "
                              f"1F1B holds at most min(p - rank, m) = {min(p - r, m)}",
                              hint(name, student_fn, ["too many activations held at once: start the "
                                                      "backwards earlier",
                                                      "the warm-up is min(p - rank - 1, m) forwards"], "memory"))
        if abs(sim.bubble_fraction - (p - 1) / m) > 1e-9:
            return report(title, False, f"simulated bubble {sim.bubble_fraction:.4f}, 1F1B's is (p-1)/m = "
                          f"{(p - 1) / m:.4f}", hint(name, student_fn, "do not wait longer than needed "
                                                     "between F and B", "bubble"))
    return _run(name, _build(student_fn, run_p, run_m), 1, student_fn,
                f"valid, bubble (p-1)/m and at most p - rank microbatches held for "
                + ", ".join(f"p={p_} m={m_}" for p_, m_ in sizes))


def interleaved(student_fn, sizes=((2, 2, 4), (4, 2, 8), (2, 3, 4), (4, 4, 4), (3, 2, 6)),
                run: tuple = (2, 2, 4)):
    """Validate, simulate, plan and run the student's interleaved 1F1B; print one [check] line."""
    from ..pipeline_parallel import p2p_plan
    from ..pipeline_parallel.simulate import simulate
    name = "interleaved"
    for p, v, m in sizes:
        title = f"{name} (p={p}, v={v}, m={m})"
        sched, failed = _try(name, title, student_fn, lambda: _build(student_fn, p, v, m), [
            "the schedule cannot run: read the message (which microbatch, chunk and rank)",
            "forward order: microbatches in groups of p; each group goes through chunk 0, then chunk 1, "
            "..., chunk v-1; the backward order is the same with the chunks reversed",
            "warm-up w = min(2(p-rank-1) + (v-1)p, m v) chunk-forwards, then pairs (next forward, "
            "next backward), then the last w backwards"])
        if failed is not None:
            return failed
        sim = simulate(sched)
        if abs(sim.bubble_fraction - (p - 1) / (v * m)) > 1e-9:
            return report(title, False, f"simulated bubble {sim.bubble_fraction:.4f}, the interleaved "
                          f"schedule's is (p-1)/(v m) = {(p - 1) / (v * m):.4f}", hint(name, student_fn, [
                              "the bubble is too large: some rank waits for a chunk it could have run",
                              "run chunk 0 of a group of p microbatches, then chunk 1 of the same group, ..."],
                              "bubble"))
        for r in range(p):
            want = min(2 * (p - r - 1) + (v - 1) * p + 1, m * v)
            if sim.peak_in_flight[r] != want:
                return report(title, False, f"rank {r} holds {sim.peak_in_flight[r]} chunk-microbatches at "
                              f"its peak; Megatron's warm-up holds {want}", hint(name, student_fn, [
                                  "the warm-up length differs from Megatron's",
                                  "warm-up = min(2(p-rank-1) + (v-1)p, m v) chunk-forwards"], "memory"))
        try:
            p2p_plan.plan(sched)
        except ValueError as e:
            return report(title, False, f"its messages cannot be batched safely for NCCL: {e}",
                          hint(name, student_fn, "keep Megatron's order: steady-state pairs F, B", "p2p"))
    p, v, m = run
    return _run(name, _build(student_fn, p, v, m), v, student_fn,
                "valid, bubble (p-1)/(v m), Megatron's in-flight count and NCCL-safe p2p for "
                + ", ".join(f"p={a} v={b} m={c}" for a, b, c in sizes))


def _run(name, sched, v, student_fn, passed):
    """Run ``sched`` on its ranks in float64 and compare gradients with the dense model."""
    from ..launcher import LaunchTimeout, RankFailed
    from ..measure.pipeline import measure
    p, m = len(sched), 1 + max(a.microbatch for a in sched[0])
    try:
        run = measure(sched, hidden_size=32, seq_length=16, micro_batch_size=2, iterations=1,
                      return_grads=True, params_dtype="float64", timeout=60.0)
    except (RankFailed, LaunchTimeout) as e:
        return report(name, False, f"running it failed: {str(e).splitlines()[0]}",
                      hint(name, student_fn, "a rank waits for a message that is never sent: check the order",
                           "run"))
    ref = _dense_grads(p * v, m)
    for r, grads in enumerate(run.grads):
        for pname, g in grads.items():
            problem = describe_mismatch(g, ref[pname], atol=1e-12, rtol=1e-12, what=f"rank {r} {pname} ")
            if problem:
                return report(name, False, problem, hint(name, student_fn, "each microbatch needs exactly "
                                                         "one F and one B per chunk", "grads"))
    return report(name, True, f"{passed}; run on {p} ranks, gradients equal the dense model's")


def _dense_grads(num_layers, m):
    from .. import data
    from ..model import GPT, GPTConfig
    model = GPT(GPTConfig(num_layers=num_layers, hidden_size=32, num_attention_heads=4, seq_length=16),
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
                      hint(name, name, ["count the idle slots of one rank, in units of a chunk's forward",
                                        "bubble = idle / busy = (p - 1) / (v * m) for the 1F1B family"]))
    return report(name, True, f"{got:.4f} for p={p}, v={v}, m={m}: (p-1)/(v m) = "
                  f"{p - 1}/({v}*{m})")


def p2p_messages(prediction, schedule, rank: int = 0, name: str = "p2p_messages"):
    """Compare a predicted number of messages ``rank`` sends in one iteration of ``schedule`` with
    the count of its NCCL-safe plan (``labkit.pipeline_parallel.p2p_plan``)."""
    from ..pipeline_parallel import p2p_plan
    from ..pipeline_parallel.simulate import validate
    p, v, m = validate(schedule)
    sent = sum(len(step.sends) for step in p2p_plan.plan(schedule)[rank])
    if prediction is None:
        return report(name, False, "no prediction given", "replace None by a number")
    if int(prediction) != sent:
        return report(name, False, f"predicted {prediction}, rank {rank} sends {sent} messages for p={p}, "
                      f"v={v}, m={m}", hint(name, name, [
                          "follow one microbatch: which stage boundaries does it cross, on which rank?",
                          "rank 0 holds virtual stages 0, p, 2p, ...: each forward out of a stage below "
                          "the last sends, each backward out of a stage above the first sends"]))
    return report(name, True, f"rank {rank} sends {sent} messages for p={p}, v={v}, m={m}: "
                  f"{sent // m} per microbatch")

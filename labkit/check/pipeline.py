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
runs. A schedule is data: the student's function returns it, the judge validates, simulates and
runs it with labkit's executor. ``bubble`` and ``p2p_messages`` check a number the student
predicts (schedules and simulator banned). The 1F1B *loop* over send/recv is ``pipeline_loop.py``.
"""
from __future__ import annotations

from . import describe_mismatch, report
from .compare import far, number
from .spec import Spec, call, failed, run

SCHED = "labkit.pipeline_parallel.schedules"
OWN_SCHEDULES = tuple(f"{SCHED}:{n}" for n in ("gpipe", "one_f_one_b", "warmup_1f1b", "interleaved",
                                                "warmup_interleaved", "_virtual_mb", "zb_h1"))
WHY = "the schedule is the exercise"


def _build(student, *shape):
    """The student's schedule for ``shape`` as plain data: [[kind, mb, chunk], ...] per rank."""
    fn = student.load()["schedule"]
    out = []
    with student.banning(OWN_SCHEDULES, WHY):
        for r in range(shape[0]):
            got, failure = call(fn, *shape, r)
            if failure:
                return failure
            try:
                out.append([[a.kind, a.microbatch, getattr(a, "chunk", 0)] for a in got])
            except (AttributeError, TypeError) as e:
                return {"failed": "raised", "detail": f"rank {r}: {type(e).__name__}: {e} (return a list of "
                        "Action)"}
    return out


def _actions(data):
    from ..pipeline_parallel.schedules import Action
    return [[Action(str(k), int(mb), int(c)) for k, mb, c in rank] for rank in data]


def _sized(data, p: int, v: int, m: int) -> str:
    """Why ``data`` is not p ranks of at most 2 v m actions [kind, mb < m, chunk < v] ("" if it is), from
    the case, before any heavy work (microbatch 10**7 once made validate build 2 x 10**7 actions)."""
    if type(data) is not list or len(data) != p:
        return f"a schedule for {len(data) if type(data) is list else 'no'} ranks, the case has p={p}"
    for r, rank in enumerate(data):
        if type(rank) is not list or len(rank) > 2 * v * m:
            return f"rank {r}: more than the 2 v m = {2 * v * m} actions a rank runs (or not a list)"
        for a in rank:
            if not (type(a) is list and len(a) == 3 and type(a[0]) is str and len(a[0]) <= 8
                    and type(a[1]) is int and 0 <= a[1] < m and type(a[2]) is int and 0 <= a[2] < v):
                return (f"rank {r}: the action {str(a)[:60]} is not [kind, microbatch < m={m}, "
                        f"chunk < v={v}]")
    return ""


def _valid(title, data, levels, p: int, v: int, m: int):
    """(schedule, None) or (None, failed CheckResult) when the data is no valid schedule of the case's size."""
    from ..pipeline_parallel.simulate import validate
    bad = failed(title, data)
    if bad is not None:
        return None, bad
    why = _sized(data, p, v, m)
    if why:
        return None, report(title, False, why, levels)
    try:
        sched = _actions(data)
        validate(sched)
        return sched, None
    except Exception as e:  # noqa: BLE001 - any error is the student's to see
        return None, report(title, False, f"{type(e).__name__}: {e}", levels)


def _produce_1f1b(student, sizes=((2, 4), (4, 8), (3, 2), (4, 1)), run_p=2, run_m=4):
    return {f"{p},{m}": _build(student, p, m) for p, m in [*sizes, (run_p, run_m)]}


def _judge_1f1b(data, sizes=((2, 4), (4, 8), (3, 2), (4, 1)), run_p=2, run_m=4):
    from ..pipeline_parallel.simulate import simulate
    name = "one_f_one_b"
    for p, m in sizes:
        title = f"{name} (p={p}, m={m})"
        sched, bad = _valid(title, data[f"{p},{m}"], "the schedule cannot run: read the message (which "
                            "microbatch, which rank)", p, 1, m)
        if bad is not None:
            return bad
        sim = simulate(sched)
        for r in range(p):
            if sim.peak_in_flight[r] > min(p - r, m):
                return report(title, False, f"rank {r} holds {sim.peak_in_flight[r]} microbatches at once; 1F1B "
                              f"holds at most min(p - rank, m) = {min(p - r, m)}", "too many activations held at "
                              "once: start the backwards earlier")
        if abs(sim.bubble_fraction - (p - 1) / m) > 1e-9:
            return report(title, False, f"simulated bubble {sim.bubble_fraction:.4f}, 1F1B's is (p-1)/m = "
                          f"{(p - 1) / m:.4f}", "do not wait longer than needed between F and B")
    sched, bad = _valid(name, data[f"{run_p},{run_m}"], "the schedule cannot run", run_p, 1, run_m)
    if bad is not None:
        return bad
    return _run(name, sched, 1, "valid, bubble (p-1)/m and at most p - rank microbatches held for "
                + ", ".join(f"p={p_} m={m_}" for p_, m_ in sizes))


def _produce_interleaved(student, sizes=((2, 2, 4), (4, 2, 8), (2, 3, 4), (4, 4, 4), (3, 2, 6)), run=(2, 2, 4)):
    return {",".join(map(str, s)): _build(student, *s) for s in [*sizes, tuple(run)]}


def _judge_interleaved(data, sizes=((2, 2, 4), (4, 2, 8), (2, 3, 4), (4, 4, 4), (3, 2, 6)), run=(2, 2, 4)):
    from ..pipeline_parallel import p2p_plan
    from ..pipeline_parallel.simulate import simulate
    name = "interleaved"
    for p, v, m in sizes:
        title = f"{name} (p={p}, v={v}, m={m})"
        sched, bad = _valid(title, data[f"{p},{v},{m}"], "the schedule cannot run: read the message (which "
                            "microbatch, chunk and rank)", p, v, m)
        if bad is not None:
            return bad
        sim = simulate(sched)
        if abs(sim.bubble_fraction - (p - 1) / (v * m)) > 1e-9:
            return report(title, False, f"simulated bubble {sim.bubble_fraction:.4f}, the interleaved schedule's "
                          f"is (p-1)/(v m) = {(p - 1) / (v * m):.4f}", "the bubble is too large: some rank waits "
                          "for a chunk it could have run")
        for r in range(p):
            want = min(2 * (p - r - 1) + (v - 1) * p + 1, m * v)
            if sim.peak_in_flight[r] != want:
                return report(title, False, f"rank {r} holds {sim.peak_in_flight[r]} chunk-microbatches at its "
                              f"peak; Megatron's warm-up holds {want}", "the warm-up length differs from Megatron's")
        try:
            p2p_plan.plan(sched)
        except ValueError as e:
            return report(title, False, f"its messages cannot be batched safely for NCCL: {e}",
                          "keep Megatron's order: steady-state pairs F, B")
    sched, bad = _valid(name, data[",".join(map(str, run))], "the schedule cannot run", *run)
    if bad is not None:
        return bad
    return _run(name, sched, run[1], "valid, bubble (p-1)/(v m), Megatron's in-flight count and NCCL-safe p2p for "
                + ", ".join(f"p={a} v={b} m={c}" for a, b, c in sizes))


def _run(name, sched, v, passed):
    """Run ``sched`` with labkit's executor in float64 (the judge's process: the schedule is data)
    and compare every gradient with the dense model's."""
    from ..launcher import LaunchTimeout, RankFailed
    from ..measure.pipeline import measure
    p, m = len(sched), 1 + max(a.microbatch for a in sched[0])
    try:
        result = measure(sched, hidden_size=32, seq_length=16, micro_batch_size=2, iterations=1,
                         return_grads=True, params_dtype="float64", timeout=60.0)
    except (RankFailed, LaunchTimeout) as e:
        return report(name, False, f"running it failed: {str(e).splitlines()[0]}",
                      "a rank waits for a message that is never sent: check the order")
    ref = _dense_grads(p * v, m)
    for r, grads in enumerate(result.grads):
        for pname, g in grads.items():
            problem = describe_mismatch(g, ref[pname], atol=1e-12, rtol=1e-12, what=f"rank {r} {pname} ")
            if problem:
                return report(name, False, problem, "each microbatch needs exactly one F and one B per chunk")
    return report(name, True, f"{passed}; run on {p} ranks, gradients equal the dense model's")


def _dense_grads(num_layers, m):
    from .. import data
    from ..model import GPT, GPTConfig
    model = GPT(GPTConfig(num_layers=num_layers, hidden_size=32, num_attention_heads=4, seq_length=16),
                seed=0).double()
    inputs, labels = data.get_batch(data.load_tokens(), 0, 2 * m, 16, 0)
    model.loss(inputs, labels).backward()
    return {n: prm.grad for n, prm in model.named_parameters()}


ONE_F_ONE_B = Spec("one-f-one-b", {"schedule": "my_one_f_one_b"}, _produce_1f1b, _judge_1f1b, cases=({},),
                   forbid=OWN_SCHEDULES, why=WHY, hints=(
                       "draw p = 4 ranks over time: how many forwards must rank r run before the first gradient "
                       "comes back to it?",
                       "each rank: a warm-up of forwards, then pairs F, B, then the remaining backwards; every "
                       "microbatch once forward and once backward, each F before its B",
                       "warm-up = min(p - rank - 1, m) forwards, then m - warm-up pairs (F of the next "
                       "microbatch, B of the oldest), then the warm-up's backwards"))
INTERLEAVED = Spec("interleaved", {"schedule": "my_interleaved"}, _produce_interleaved, _judge_interleaved,
                   cases=({},), forbid=OWN_SCHEDULES, why=WHY, hints=(
                       "list the m v chunk-forwards of one rank in Megatron's order first, then the backwards",
                       "forward order: microbatches in groups of p; each group goes through chunk 0, then chunk "
                       "1, ..., chunk v-1; the backward order is the same with the chunks reversed",
                       "warm-up w = min(2(p-rank-1) + (v-1)p, m v) chunk-forwards, then pairs (next forward, next "
                       "backward), then the last w backwards"))


def one_f_one_b(student_fn, sizes=((2, 4), (4, 8), (3, 2), (4, 1)), run_p: int = 2, run_m: int = 4):
    """Validate, simulate and run the student's 1F1B; print one [check] line."""
    return run(ONE_F_ONE_B, {"schedule": student_fn}, sizes=[list(s) for s in sizes], run_p=run_p, run_m=run_m)


def interleaved(student_fn, sizes=((2, 2, 4), (4, 2, 8), (2, 3, 4), (4, 4, 4), (3, 2, 6)), run: tuple = (2, 2, 4)):
    """Validate, simulate, plan and run the student's interleaved 1F1B; print one [check] line."""
    return run_spec(INTERLEAVED, {"schedule": student_fn}, sizes=[list(s) for s in sizes], run=list(run))


run_spec = run


# -- predictions: a number, checked against the simulator or the NCCL-safe plan -------------------
def _produce_number(student, which="prediction", **case):
    got = student.load()[which]
    if got is None or isinstance(got, bool) or not isinstance(got, (int, float)):
        return {"none": got is None, "type": type(got).__name__}
    return {"value": float(got)}


def _schedule(kind: str, p: int, v: int, m: int):
    from ..pipeline_parallel import schedules as S
    return S.interleaved(p, v, m) if v > 1 else S.one_f_one_b(p, m)


def _judge_bubble(data, p=4, v=2, m=8, which="prediction"):
    from ..pipeline_parallel.simulate import simulate
    name = "bubble"
    if "value" not in data:
        return report(name, False, "no prediction given" if data.get("none") else f"the prediction is a "
                      f"{data.get('type')}, not a number", "replace None by a number")
    got = simulate(_schedule("interleaved", p, v, m)).bubble_fraction
    if far(data["value"], got, 1e-3):
        return report(name, False, f"predicted {data['value']:.4f}, the simulator says {got:.4f} for p={p}, v={v}, "
                      f"m={m}", "count the idle slots of one rank, in units of a chunk's forward")
    return report(name, True, f"{got:.4f} for p={p}, v={v}, m={m}: (p-1)/(v m) = {p - 1}/({v}*{m})")


def _judge_messages(data, p=2, v=2, m=4, rank=0, which="interleaved"):
    from ..pipeline_parallel import p2p_plan
    name = "p2p_messages"
    if "value" not in data:
        return report(name, False, "no prediction given" if data.get("none") else f"the prediction is a "
                      f"{data.get('type')}, not a number", "replace None by a number")
    sent = sum(len(step.sends) for step in p2p_plan.plan(_schedule("", p, v, m))[rank])
    if number(data["value"]) is None or data["value"] != sent:
        return report(name, False, f"predicted {data['value']:g}, rank {rank} sends {sent} messages for p={p}, "
                      f"v={v}, m={m}", "follow one microbatch: which stage boundaries does it cross, on which rank?")
    return report(name, True, f"rank {rank} sends {sent} messages for p={p}, v={v}, m={m}: {sent // m} per microbatch")


PREDICT = OWN_SCHEDULES + ("labkit.pipeline_parallel.simulate:simulate", "labkit.pipeline_parallel.p2p_plan:plan")
BUBBLE = Spec("bubble", {"prediction": "prediction"}, _produce_number, _judge_bubble, forbid=PREDICT,
              why="predict it yourself", cases=({"which": "prediction", "p": 4, "v": 2, "m": 8},),
              hints=("count the idle slots of one rank, in units of a chunk's forward",
                     "bubble = idle / busy = (p - 1) / (v * m) for the 1F1B family"))
MESSAGES = Spec("messages", {"interleaved": "messages_interleaved", "one_f_one_b": "messages_1f1b"},
                _produce_number, _judge_messages, forbid=PREDICT, why="predict it yourself", cases=({"which": "interleaved", "p": 2, "v": 2, "m": 4},
                                                         {"which": "one_f_one_b", "p": 2, "v": 1, "m": 4}), hints=(
                    "follow one microbatch: which stage boundaries does it cross, on which rank?",
                    "rank 0 holds virtual stages 0, p, 2p, ...: each forward out of a stage below the last sends, "
                    "each backward out of a stage above the first sends"))


def bubble(prediction, schedule=None, name: str = "bubble"):
    """Compare a predicted bubble fraction with the simulated one (equal costs, B = 2F); ``schedule``
    defaults to interleaved 1F1B with p = 4, v = 2, m = 8."""
    from ..pipeline_parallel.simulate import validate
    p, v, m = validate(schedule) if schedule is not None else (4, 2, 8)
    return run_spec(BUBBLE, {"prediction": prediction}, which="prediction", p=p, v=v, m=m)


def p2p_messages(prediction, schedule, rank: int = 0, name: str = "p2p_messages"):
    """Compare a predicted number of messages ``rank`` sends in one iteration of ``schedule`` with
    the count of its NCCL-safe plan (``labkit.pipeline_parallel.p2p_plan``)."""
    from ..pipeline_parallel.simulate import validate
    p, v, m = validate(schedule)
    which = "interleaved" if v > 1 else "one_f_one_b"
    return run_spec(MESSAGES, {which: prediction}, which=which, p=p, v=v, m=m, rank=rank)


def _specs():
    from . import pipeline_loop
    return {s.id: s for s in (ONE_F_ONE_B, INTERLEAVED, BUBBLE, MESSAGES, pipeline_loop.LOOP)}


def hint(exercise_id: str) -> str:
    """Print the next hint of ``exercise_id``."""
    from .hints import asker
    return asker(_specs())(exercise_id)


def __getattr__(name):
    if name == "SPECS":
        return _specs()
    if name == "one_f_one_b_loop":
        from .pipeline_loop import one_f_one_b_loop
        return one_f_one_b_loop
    raise AttributeError(name)

"""The driver: draw layouts (Hypothesis, a fixed seed), run each, judge it, shrink what fails.

Chapter "Finding the bug nobody chose". ``labkit.fuzz.fuzz(seed=0, layouts=40)`` draws layouts from
``space.layouts`` in the order Hypothesis's seeded generator gives (the same seed, the same
layouts); each is refused by a named rule (counted, free) or run with ``labkit.train`` for
``steps`` iterations and judged by ``oracle.compare`` (and ``oracle.compare_bytes``). Throughput:
the shapes are tiny, the ranks fork from the launcher's warm forkserver (``import torch`` paid
once), and the single-device reference is run once per SHAPE (:func:`reference_key`: the model, the
data and the padded vocabulary, not the layout) and shared by every layout of that shape.

A finding (a problem of the oracle, or a crash of a layout the rules accepted) is shrunk
(``shrink.shrink``) and reported (``report.reproducer``: a JSON file, a one-line command and
``labkit diverge``'s report). ``bug``: a planted bug of ``labkit.debug.BUGS`` applied to every
labkit run (to measure how fast the fuzzer finds it).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from .space import refusal

LAYOUT_FIELDS = {"tensor_model_parallel_size", "sequence_parallel", "context_parallel_size", "cp_comm_type",
                 "pipeline_model_parallel_size", "num_layers_per_virtual_pipeline_stage", "pipeline_schedule",
                 "expert_model_parallel_size", "expert_tensor_parallel_size", "moe_token_dispatcher_type",
                 "zero_stage", "use_distributed_optimizer", "ddp_bucket_size", "recompute_granularity",
                 "recompute_method", "recompute_num_layers", "recompute_modules"}


def reference_config(layout: dict) -> dict:
    """The single-device run's arguments for ``layout``: its model and data only, the global batch,
    the padded vocabulary and a MoE's routing groups made explicit (they depend on the layout: dp,
    tp, and tp under SP, where each tp rank counts the expert capacity over its own positions)."""
    from ..config import train_config
    cfg = train_config(**layout["config"])
    topo = cfg.topology(layout["world_size"])
    ref = {k: v for k, v in layout["config"].items() if k not in LAYOUT_FIELDS}
    ref["global_batch_size"] = cfg.global_batch(topo)
    ref["make_vocab_size_divisible_by"] = cfg.model_config().vocab_size   # padded V: 256 -> V on one device
    if cfg.num_experts is not None and cfg.moe_expert_capacity_factor is not None and cfg.sequence_parallel:
        ref["moe_routing_groups"] = topo.tp
    return ref


def reference_key(layout: dict, steps: int) -> tuple:
    return (steps, tuple(sorted((k, repr(v)) for k, v in reference_config(layout).items())))


@dataclass
class Outcome:
    layout: dict
    status: str                      # "refused", "ok", "finding" or "known" (known.py)
    problems: list = field(default_factory=list)
    seconds: float = 0.0
    rule: str | None = None          # the refusal's message


class Runner:
    """Runs and judges layouts, sharing references by shape (``refs``)."""

    def __init__(self, steps: int = 2, bug: str | None = None, timeout: float = 240.0, check_bytes: bool = True):
        self.steps, self.bug, self.timeout, self.check_bytes = steps, bug, timeout, check_bytes
        self.refs: dict = {}
        self.seen: dict = {}             # layout -> Outcome: the shrinker asks again, the fuzzer redraws
        self.runs = 0

    def reference(self, layout: dict) -> dict:
        from ..reference import train_reference
        key = reference_key(layout, self.steps)
        if key not in self.refs:
            self.refs[key] = train_reference(world_size=1, steps=self.steps, capture_grads=True,
                                             **reference_config(layout))
        return self.refs[key]

    def __call__(self, layout: dict) -> Outcome:
        key = (layout["world_size"], layout["implementation"], tuple(sorted((k, repr(v)) for k, v in layout["config"].items())))
        if key not in self.seen:
            self.seen[key] = self._judge(layout)
        return self.seen[key]

    def _judge(self, layout: dict) -> Outcome:
        t0 = time.perf_counter()
        rule = refusal(layout)
        if rule is not None:
            return Outcome(layout, "refused", rule=rule, seconds=time.perf_counter() - t0)
        import labkit
        from ..config import train_config
        from .oracle import compare, compare_bytes, predicts
        cfg = train_config(**layout["config"])
        impl = layout["implementation"]
        probe = None
        if self.bug is not None and impl == "labkit":
            from ..debug.bugs import Plant
            probe = Plant(self.bug)
        self.runs += 1
        try:
            run = labkit.train(world_size=layout["world_size"], steps=self.steps, log_interval=0, capture_grads=True,
                               implementation=impl, timeout=self.timeout, probe=probe, **layout["config"])
        except ValueError as e:            # a rule of the implementation (megatron's, preflight's)
            return Outcome(layout, "refused", rule=str(e), seconds=time.perf_counter() - t0)
        except Exception as e:             # accepted by the rules, then failed: a finding
            last = (str(e).strip().splitlines() or [""])[-1][:300]
            return _classify(Outcome(layout, "finding", [{"kind": "crash", "what": f"{type(e).__name__}: {last}",
                                                          "error": float("inf"), "bound": 0.0}], time.perf_counter() - t0))
        dropout = bool(cfg.hidden_dropout or cfg.attention_dropout)
        problems = compare(run, self.reference(layout), cfg, dropout)
        if not problems and self.check_bytes and predicts(cfg, impl):
            problems = compare_bytes(run, cfg, self.steps)
        return _classify(Outcome(layout, "finding" if problems else "ok", problems, time.perf_counter() - t0))


def _classify(o: Outcome) -> Outcome:
    """A finding that matches a known, filed one (known.py) is "known", its name as the rule."""
    from .known import known
    name = known(o.layout, o.problems[0]["kind"]) if o.status == "finding" else None
    if name is not None:
        o.status, o.rule = "known", name
    return o


def megatron_runs(layout: dict) -> bool:
    """False for a megatron layout that labkit's rules accept and Megatron's own refuse, or that this
    oracle cannot judge; True else."""
    if layout["implementation"] != "megatron" or refusal(layout) is not None:
        return True
    if layout["config"].get("use_distributed_optimizer"):
        # the oracle compares gradients; Megatron's distributed optimizer leaves each rank its shard
        # of the reduce-scattered sum only (labkit.megatron.run reports none): judged by the
        # parameters after the steps instead, in tests/test_megatron.py (fuzz seed 1,002,029 drew one)
        return False
    from ..config import train_config
    from ..megatron.options import refusals
    return not refusals(train_config(**layout["config"]), layout["world_size"])


def draw_layouts(seed: int, count: int, implementations=("labkit",), max_world: int = 8) -> list[dict]:
    """``count`` layouts drawn by Hypothesis from ``seed``: the same seed gives the same list."""
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hseed

    from .space import layouts
    out: list = []

    @hseed(seed)
    @settings(max_examples=count, phases=[Phase.generate], database=None, deadline=None,
              suppress_health_check=list(HealthCheck), derandomize=False)
    @given(layouts(tuple(implementations), max_world))
    def collect(layout):
        out.append(layout)
    collect()
    return out[:count]


@dataclass
class FuzzResult:
    seed: int
    outcomes: list
    findings: list                   # [report.Finding]
    seconds: float

    def counts(self) -> dict:
        c = {"drawn": len(self.outcomes)}
        for o in self.outcomes:
            c[o.status] = c.get(o.status, 0) + 1
        return c

    def by_world(self) -> dict:
        """{world size: (layouts run, mean seconds per layout)}."""
        acc: dict = {}
        for o in self.outcomes:
            if o.status != "refused":
                acc.setdefault(o.layout["world_size"], []).append(o.seconds)
        return {w: (len(s), sum(s) / len(s)) for w, s in sorted(acc.items())}


def fuzz(seed: int = 0, layouts: int | None = 40, minutes: float | None = None, implementations=("labkit",),
         bug: str | None = None, steps: int = 2, shrink: bool = True, diverge: bool = True, stop_at_first: bool = False,
         out: str | None = None, max_world: int = 8, log=None) -> FuzzResult:
    """Draw and judge layouts from ``seed`` until ``layouts`` are drawn or ``minutes`` pass; shrink
    and report each finding (one per kind of problem). ``log(line)``: progress (print)."""
    from .report import make_finding
    from .shrink import shrink as shrink_layout
    if layouts is None and minutes is None:
        raise ValueError("fuzz needs a budget: layouts=N or minutes=M")
    t0, runner = time.perf_counter(), Runner(steps, bug)
    outcomes, findings, seen = [], [], set()
    for layout in _pools(seed, layouts, minutes, implementations, max_world):
        if minutes is not None and time.perf_counter() - t0 > 60 * minutes:
            break
        o = runner(layout)
        outcomes.append(o)
        if log is not None:
            log(f"[{len(outcomes)}] {o.status:8s} {o.seconds:5.1f} s  {_line(o)}")
        kind = o.problems[0]["kind"] if o.problems else None
        if o.status == "finding" and kind not in seen:
            seen.add(kind)
            small = shrink_layout(o, runner, log=log) if shrink else o
            findings.append(make_finding(o, small, seed, len(outcomes), bug, steps, diverge, out))
            if stop_at_first:
                break
    return FuzzResult(seed, outcomes, findings, time.perf_counter() - t0)


def _pools(seed: int, layouts: int | None, minutes: float | None, implementations, max_world: int):
    """The layouts to judge, in order: one pool drawn whole (Hypothesis's stream is not prefix-stable
    across example counts, so a pool is fixed by (seed, size)). With a time budget the pool holds
    several times the layouts per minute this machine runs (Megatron's: ~6), and when a fast machine
    has judged it all before the time is up, the next pool is drawn from seed + 1,000,003 k (k = 1,
    2, ...): a run with ``minutes`` (and ``layouts`` None) runs for that long."""
    mg = "megatron" in implementations
    count = layouts if layouts is not None else max(100, int((6 if mg else 20) * minutes))
    # Megatron refuses what it cannot run on the CPU (CP, dropout, recompute, ...: megatron/options.py):
    # draw 4 times as many and keep those it accepts (about 1 in 3), so its budget goes to runs
    wide = 4 if mg else 1
    for k in range(10 ** 6 if layouts is None else 1):     # a count given: one pool, that many
        pool = draw_layouts(seed + 1_000_003 * k, count * wide, implementations, max_world)
        yield from [lay for lay in pool if megatron_runs(lay)][:count]


def replay(path: str, steps: int | None = None):
    """Run a reproducer again with the same oracle: its Outcome."""
    import json
    with open(path) as f:
        r = json.load(f)
    c = dict(r["config"])
    if "recompute_modules" in c and c["recompute_modules"] is not None:
        c["recompute_modules"] = tuple(c["recompute_modules"])
    layout = {"world_size": r["world_size"], "implementation": r["implementation"], "config": c}
    return Runner(steps or r["steps"], r.get("bug"))(layout)


def _line(o: Outcome) -> str:
    from .space import describe
    text = describe(o.layout)
    if o.status == "refused":
        return f"{text}  -- {o.rule.splitlines()[0][:100]}"
    if o.status == "known":
        return f"{text}  -- known finding {o.rule}"
    if o.problems:
        p = o.problems[0]
        return f"{text}  -- {p['kind']}: {p['what'][:120]}"
    return text

"""Checks for the roofline lab (chapter "Where the time goes"): a GEMM's arithmetic intensity, an
op's bound and time on the roofline, and where DP and TP turn communication-bound.

* ``gemm-intensity``: ``arithmetic_intensity(M, N, K, bytes_per_element=2)`` of [M, K] x [K, N]:
  2MNK FLOPs over the bytes of reading A and B and writing C once, e (MK + KN + MN); against
  ``labkit.calc.roofline.gemm_intensity`` within 1e-9 (relative), for each GEMM of the case.
* ``roofline-bound``: ``roofline_bound(flops, bytes_moved, peak_flops, bandwidth)`` returns
  ``(bound, seconds)``: "compute" when F / B >= P / W (the ridge), else "memory", and the lower bound
  max(F / P, B / W); against ``rl.bound`` and ``rl.op_time`` for every op of one layer's forward
  (``rl.layer_ops``) on the HBM of the case's GPU.
* ``comm-crossover``: ``comm_crossover(axis, n, peak_flops, bandwidth, bytes_per_element=2)``, axis
  "dp" (tokens per GPU per step) or "tp" (hidden size): where the collective's time equals that of
  the compute it hides behind (no overlap); against ``rl.crossover`` within 1e-6.

``produce`` reads every number (models, GPUs, links) from ``labkit.calc`` before the student's function
runs with labkit's answer banned; ``judge`` recomputes it with ``labkit.calc.roofline``. A wrong number
is matched against the classic slips (a multiply-add counted once, C never written, the two times
summed, a ring's (n-1)/n forgotten, forward FLOPs only) and the hint names the one it looks like.
Visible: the chapter's Llama 3 70B layer on an H100 and DGX H100's links; hidden: A100, H200 and
B200, FP8 and fp32 elements, groups of 2 to 64 (``solutions/hidden/roofline-lab.json``).
"""
from __future__ import annotations

from . import report
from .compare import far, number
from .hints import asker
from .spec import Spec, call, failed, failure, run

WHY = "the roofline arithmetic is the exercise"
OWN_I = ("labkit.calc.roofline:gemm_intensity", "labkit.calc.roofline:gemm_op")
OWN_B = ("labkit.calc.roofline:bound", "labkit.calc.roofline:op_time", "labkit.calc.roofline:attainable_flops")
OWN_X = ("labkit.calc.roofline:crossover",)
RTOL = 1e-9                  # the same formula in another order differs by ~1e-16
RTOL_X = 1e-6
UNITS = {"dp": "tokens per GPU per step", "tp": "hidden size h"}


def _show(x) -> str:
    return f"{x:.6g}" if number(x) is not None else repr(x)[:40]


def _near(got, value) -> bool:
    """``got`` is within 1e-6 of ``value`` (relative): the slip a hint names."""
    return number(got) is not None and value != 0 and abs(got - value) <= 1e-6 * abs(value)


def _number_or_invalid(got, what: str):
    if type(got) in (int, float):
        return None
    return failure("invalid", f"{what} returned {type(got).__name__}: return a Python float "
                   "(float(x) of a tensor or a numpy value)")


# -- gemm-intensity ----------------------------------------------------------------------------
def _gemm(g) -> str:
    M, N, K, e = g
    return f"[{M}, {K}] x [{K}, {N}] in {e}-byte elements"


def _produce_i(student, gemms):
    fn = student.load()["intensity"]
    out = []
    with student.banning(OWN_I, WHY):
        for M, N, K, e in gemms:
            got, bad = call(fn, M, N, K, bytes_per_element=e)
            bad = bad or _number_or_invalid(got, "arithmetic_intensity")
            if bad:
                return bad
            out.append(got)
    return out


def _hint_i(M, N, K, e, got) -> str:
    flops, terms = 2.0 * M * N * K, M * K + K * N + M * N
    for value, hint in ((flops / 2 / (e * terms), "a multiply-add is 2 FLOPs: 2MNK, not MNK"),
                        (flops / (e * (M * K + K * N)), "C is written once too: bytes = e (MK + KN + MN)"),
                        (flops / terms, "bytes are elements times bytes_per_element"),
                        (e * terms / flops, "the intensity is FLOPs per byte: FLOPs over bytes")):
        if _near(got, value):
            return hint
    return "FLOPs: 2MNK (a multiply and an add per term); bytes: A (MK), B (KN) and C (MN) once each, " \
           "times bytes_per_element"


def _judge_i(data, gemms):
    from ..calc import roofline as rl
    name = f"arithmetic_intensity ({len(gemms)} GEMMs)"
    bad = failed(name, data, "arithmetic_intensity returns one number, FLOPs per byte")
    if bad is not None:
        return bad
    if type(data) is not list or len(data) != len(gemms):
        return report(name, False, f"expected one intensity for each of the {len(gemms)} GEMMs")
    for g, got in zip(gemms, data):
        want = rl.gemm_intensity(*g)
        if far(got, want, RTOL * want):
            return report(name, False, f"{_gemm(g)}: {_show(got)} FLOPs per byte, expected {want:.6g}",
                          _hint_i(*g, got))
    return report(name, True, "; ".join(f"{g[0]}x{g[1]}x{g[2]} ({g[3]} B): {rl.gemm_intensity(*g):,.1f}" for g in gemms)
                  + " FLOPs per byte, as labkit.calc.roofline.gemm_intensity")


# -- roofline-bound ----------------------------------------------------------------------------
def layer(model, cluster, tp=1, cp=1, micro_batch_size=1):
    """(ops of one layer's forward on one GPU, peak FLOP/s, HBM bytes/s) of the case."""
    from .. import calc
    from ..calc import roofline as rl
    gpu = calc.CLUSTERS[cluster].gpu
    return rl.layer_ops(calc.model(model), tp, cp, micro_batch_size), gpu.peak_flops, gpu.hbm_bandwidth


def _produce_b(student, model, cluster, tp=1, cp=1, micro_batch_size=1):
    ops, P, W = layer(model, cluster, tp, cp, micro_batch_size)     # before the ban: plain numbers
    fn = student.load()["bound"]
    out = []
    with student.banning(OWN_B, WHY):
        for op in ops:
            got, bad = call(fn, op.flops, op.bytes, P, W)
            if bad:
                return bad
            if not (isinstance(got, (tuple, list)) and len(got) == 2 and type(got[0]) is str):
                return failure("invalid", f"roofline_bound returned {type(got).__name__}, not (bound, seconds): "
                               "a str and a float")
            bad = _number_or_invalid(got[1], "roofline_bound's seconds")
            if bad:
                return bad
            out.append([got[0], got[1]])
    return out


def _hint_b(op, P, W, want_bound, got_bound, got_s) -> str:
    if type(got_bound) is not str or got_bound != want_bound:
        if type(got_bound) is not str or got_bound not in ("compute", "memory"):
            return "the bound is the str 'compute' or 'memory'"
        return (f"its intensity F / B = {op.flops / op.bytes:,.4g} FLOPs per byte against the ridge P / W = "
                f"{P / W:,.4g}: at or right of the ridge an op is compute-bound, left of it memory-bound")
    tc, tm = op.flops / P, op.bytes / W
    for value, hint in ((tc + tm, "the memory and the tensor cores work at the same time: the bound is the "
                                  "larger of F / P and B / W, not their sum"),
                        (min(tc, tm), "the slower of the two sets the pace: max(F / P, B / W), not min")):
        if _near(got_s, value):
            return hint
    return "seconds = max(F / P, B / W): FLOPs over FLOP/s, bytes over bytes/s"


def _judge_b(data, model, cluster, tp=1, cp=1, micro_batch_size=1):
    from ..calc import roofline as rl
    name = f"roofline_bound ({model} layer, TP {tp}, CP {cp}, micro batch {micro_batch_size}, {cluster})"
    bad = failed(name, data, "roofline_bound returns (bound, seconds): 'compute' or 'memory', and a float")
    if bad is not None:
        return bad
    ops, P, W = layer(model, cluster, tp, cp, micro_batch_size)
    if type(data) is not list or len(data) != len(ops) or any(type(d) is not list or len(d) != 2 for d in data):
        return report(name, False, f"expected (bound, seconds) for each of the layer's {len(ops)} ops")
    for op, (got_bound, got_s) in zip(ops, data):
        want_bound, want_s = rl.bound(op, P, W), rl.op_time(op, P, W)
        wrong = type(got_bound) is not str or got_bound != want_bound
        if wrong or far(got_s, want_s, RTOL * want_s):
            what = (f"bound {repr(got_bound)[:40]}, expected {want_bound!r}" if wrong else
                    f"{_show(got_s)} s, expected {want_s:.6g} s")
            return report(name, False, f"{op.name} ({op.flops / 1e9:,.4g} GFLOP, {op.bytes / 1e6:,.4g} MB): {what}",
                          _hint_b(op, P, W, want_bound, got_bound, got_s))
    kinds = {b: [op.name for op, (g, _) in zip(ops, data) if g == b] for b in ("compute", "memory")}
    return report(name, True, f"compute-bound: {', '.join(kinds['compute']) or 'none'}; memory-bound: "
                  f"{', '.join(kinds['memory']) or 'none'}; the forward takes at least "
                  f"{sum(s for _, s in data) * 1e6:,.0f} µs (ridge {P / W:,.0f} FLOPs per byte)")


# -- comm-crossover ----------------------------------------------------------------------------
def link(cluster, name):
    """(peak FLOP/s, bytes/s per GPU) of the case: "nvlink" inside a node, "nic" a GPU's share of
    its node's network cards (the chapter's per-GPU network bandwidth)."""
    from .. import calc
    c = calc.CLUSTERS[cluster]
    return c.gpu.peak_flops, c.intra_node_bandwidth if name == "nvlink" else c.inter_node_bandwidth / c.gpus_per_node


def _produce_x(student, axis, n, cluster, link_name="nic", bytes_per_element=2):
    P, W = link(cluster, link_name)
    fn = student.load()["crossover"]
    with student.banning(OWN_X, WHY):
        got, bad = call(fn, axis, n, P, W, bytes_per_element=bytes_per_element)
    return bad or _number_or_invalid(got, "comm_crossover") or got


def _hint_x(axis, n, e, R, got) -> str:
    share = (n - 1) / n
    slips = {"dp": ((e / 3 * R, "a ring all-reduce sends 2 (n-1)/n of the buffer per rank, not 2 times it"),
                    (e * share * R, "training does 6 FLOPs per weight per token (forward 2, backward 4), not 2"),
                    (e / 6 * share * R, "an all-reduce is a reduce-scatter and an all-gather: 2 (n-1)/n Phi e bytes")),
             "tp": ((e / 9 * n * R, "a ring all-reduce sends 2 (t-1)/t of the [T, h] activations per rank"),
                    (e / 9 * share * R, "each GPU does 1/t of the layer's FLOPs: 72 h^2 T / t"),
                    (e / 3 * (n - 1) * R, "count the backward's FLOPs too: 72 h^2 T / t for forward and backward"),
                    (e / 18 * (n - 1) * R, "four all-reduces per layer: two in the forward, two in the backward"))}
    for value, hint in slips[axis]:
        if _near(got, value):
            return hint
    return ("set compute time F / P equal to the collective's time B / W and solve for "
            + ("T: F = 6 Phi T, B = 2 (n-1)/n Phi e" if axis == "dp" else "h: F = 72 h^2 T / t, B = 8 (t-1)/t T h e"))


def _judge_x(data, axis, n, cluster, link_name="nic", bytes_per_element=2):
    from ..calc import roofline as rl
    where = "NVLink" if link_name == "nvlink" else "its share of the network"
    name = f"comm_crossover ({axis.upper()} {n} over {where}, {cluster}, {bytes_per_element}-byte elements)"
    bad = failed(name, data, "comm_crossover returns one number")
    if bad is not None:
        return bad
    P, W = link(cluster, link_name)
    want = rl.crossover(axis, n, P, W, bytes_per_element)
    if far(data, want, RTOL_X * want):
        return report(name, False, f"{_show(data)}, expected {want:,.6g} ({UNITS[axis]})",
                      _hint_x(axis, n, bytes_per_element, P / W, data))
    return report(name, True, f"{UNITS[axis]} below {want:,.0f}: communication-bound (the link's ridge P / W = "
                  f"{P / W:,.0f} FLOPs per byte), as labkit.calc.roofline.crossover")


INTENSITY = Spec(
    "gemm-intensity", {"intensity": "arithmetic_intensity"}, _produce_i, _judge_i,
    cases=({"gemms": [[4096, 4096, 4096, 2], [8192, 7168, 8192, 2], [1, 7168, 8192, 2]]},
           {"gemms": [[8192, 1280, 8192, 2], [8192, 8192, 1024, 2], [8192, 8192, 3584, 2]]}),
    forbid=OWN_I, why=WHY, hints=(
        "FLOPs: each of the M x N outputs is a sum of K products, one multiply and one add each",
        "bytes: A holds M x K elements, B K x N, C M x N; each is moved once, times bytes_per_element",
        "2 * M * N * K / (bytes_per_element * (M * K + K * N + M * N))"))
BOUND = Spec(
    "roofline-bound", {"bound": "roofline_bound"}, _produce_b, _judge_b,
    cases=({"model": "llama3-70b", "cluster": "dgx-h100", "tp": 8},
           {"model": "gpt2-774m", "cluster": "dgx-a100", "tp": 4, "cp": 4}),
    forbid=OWN_B, why=WHY, hints=(
        "the intensity F / B against the ridge P / W decides the bound",
        "the memory and the tensor cores work at the same time: the op takes as long as the slower",
        "('compute' if flops / bytes_moved >= peak_flops / bandwidth else 'memory', "
        "max(flops / peak_flops, bytes_moved / bandwidth))"))
CROSSOVER = Spec(
    "comm-crossover", {"crossover": "comm_crossover"}, _produce_x, _judge_x,
    cases=({"axis": "dp", "n": 8, "cluster": "dgx-h100", "link_name": "nic", "bytes_per_element": 2},
           {"axis": "tp", "n": 8, "cluster": "dgx-h100", "link_name": "nvlink", "bytes_per_element": 2}),
    forbid=OWN_X, why=WHY, hints=(
        "no overlap: the crossover is where F / P = B / W, the compute's time equals the collective's",
        "DP: F = 6 Phi T FLOPs per step against B = 2 (n-1)/n Phi e bytes; Phi cancels, solve for T",
        "TP: F = 72 h^2 T / t against B = 4 all-reduces x 2 (t-1)/t T h e; T cancels, solve for h"))
SPECS = {"gemm-intensity": INTENSITY, "roofline-bound": BOUND, "comm-crossover": CROSSOVER}
hint = asker(SPECS)


def _each(spec, objects) -> bool:
    return all([bool(run(spec, objects, **case)) for case in spec.cases])


def gemm_intensity(fn) -> bool:
    """Run ``fn`` on the visible GEMMs (a square one, Llama 3 70B's at TP 8, one row); one [check] line each."""
    return _each(INTENSITY, {"intensity": fn})


def roofline_bound(fn) -> bool:
    """Run ``fn`` on every op of the visible layers (the chapter's on an H100, a small one on an A100)."""
    return _each(BOUND, {"bound": fn})


def comm_crossover(fn) -> bool:
    """Run ``fn`` for DP 8 over the network and TP 8 over NVLink of DGX H100 nodes."""
    return _each(CROSSOVER, {"crossover": fn})


__all__ = ["gemm_intensity", "roofline_bound", "comm_crossover", "hint", "SPECS", "layer", "link"]

"""The layouts of the lab "Finding the bug nobody chose" (labkit.check.fuzzing): the lab's validity
rules, every valid layout by enumeration, and the one-step-simpler neighbours a shrinker walks."""
from __future__ import annotations

TP, CP, PP, SP = ("tensor_model_parallel_size", "context_parallel_size", "pipeline_model_parallel_size",
                  "sequence_parallel")
AXES = {"tp": TP, "cp": CP, "pp": PP}
MAX_DRAWS = 5000


def _dp(layout: dict) -> int:
    return layout["world_size"] // (layout[TP] * layout[CP] * layout[PP])


def why_invalid(layout: dict, shape: dict) -> str | None:
    """The rule ``layout`` breaks for ``shape`` (None: valid)."""
    w, t, c, p = layout["world_size"], layout[TP], layout[CP], layout[PP]
    if w != shape["world_size"] and w > shape["world_size"]:
        return f"world size {w} is more than the {shape['world_size']} ranks there are"
    if min(t, c, p, w) < 1 or w % (t * c * p):
        return f"tp x cp x pp = {t * c * p} does not divide the world size {w}"
    if shape["num_attention_heads"] % t:
        return f"tp = {t} does not divide the {shape['num_attention_heads']} attention heads"
    if shape["num_layers"] % p:
        return f"pp = {p} does not divide the {shape['num_layers']} layers"
    if shape["seq_length"] % (2 * c):
        return f"2 cp = {2 * c} does not divide the sequence length {shape['seq_length']}"
    if layout[SP] and t == 1:
        return "sequence parallelism without tensor parallelism (tp = 1)"
    if layout[SP] and (shape["seq_length"] // c) % t:
        return f"with sequence parallelism, tp = {t} does not divide the {shape['seq_length'] // c} positions of a CP rank"
    return None


def valid_layouts(shape: dict) -> list[dict]:
    """Every valid layout of ``shape`` on all its ranks, by enumeration."""
    w, out = shape["world_size"], []
    divisors = [d for d in range(1, w + 1) if w % d == 0]
    for t in divisors:
        for c in divisors:
            for p in divisors:
                for sp in (False, True):
                    lay = {"world_size": w, TP: t, CP: c, PP: p, SP: sp}
                    if why_invalid(lay, shape) is None:
                        out.append(lay)
    return out


def _key(lay: dict) -> tuple:
    return (lay["world_size"], lay[TP], lay[CP], lay[PP], lay[SP])


def _name(lay: dict) -> str:
    return (f"world {lay['world_size']}: tp {lay[TP]}, cp {lay[CP]}, pp {lay[PP]}, dp {_dp(lay)}"
            + (", SP" if lay[SP] else ""))


def _sizes(lay: dict) -> dict:
    return {"dp": _dp(lay), "tp": lay[TP], "cp": lay[CP], "pp": lay[PP]}


def fails(lay: dict, bug: dict) -> bool:
    """Does the case's bug act on ``lay``? (each named axis at least its size, SP if asked)"""
    s = _sizes(lay)
    return all(s[a] >= n for a, n in bug["needs"].items()) and (lay[SP] or not bug.get("sp"))


def neighbours(lay: dict) -> list[dict]:
    """Layouts one step simpler: one of dp, tp, cp, pp reduced to a smaller divisor of it (the
    world shrinks with it), or sequence parallelism off."""
    s, out = _sizes(lay), []
    for axis, n in s.items():
        for d in range(1, n):
            if n % d == 0:
                t = {**s, axis: d}
                out.append({"world_size": t["dp"] * t["tp"] * t["cp"] * t["pp"], TP: t["tp"], CP: t["cp"],
                            PP: t["pp"], SP: lay[SP] and t["tp"] > 1})
    if lay[SP]:
        out.append({**lay, SP: False})
    return out

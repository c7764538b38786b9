"""The FP8 lab's delayed-scaling exercise: one step of the amax history and the scale it gives.

``amax_update(history, amax, scale, fp8_amax_history_len, fp8_amax_compute_algo, fp8_margin,
fp8_max=448.0)`` gets the history (fp32 [fp8_amax_history_len], most recent first, zeros where
nothing was recorded yet), this step's amax and the scale in use (fp32 0-dim tensors) and returns
``(history, scale)`` for the next step, as Megatron's ``--fp8-amax-history-len``,
``--fp8-amax-compute-algo`` and ``--fp8-margin`` ask of Transformer Engine's ``DelayedScaling``:

* roll the history one place (the oldest amax falls off) and put ``amax`` first;
* amax = the history's max ("max") or its first entry ("most_recent");
* scale = (fp8_max / amax) / 2^fp8_margin in fp32, except where amax is 0 or not finite
  (inf, NaN): then the previous scale is kept (``_default_sf_compute``).

``produce`` runs the student's function over the case's amaxes from a zero history and scale 1;
``judge`` runs labkit's ``DelayedScaling`` (its history grows to the length instead of starting
with zeros: the same values, padded) and compares history and scale at every step, bit for bit.
"""
from __future__ import annotations

from . import report
from .spec import Spec, call, failed, failure

WHY = "the amax update is the exercise"
OWN = ("labkit.fp8.scaling:delayed_scale", "labkit.fp8.scaling:DelayedScaling.update",
       "labkit.fp8.scaling:DelayedScaling.quantize")


def _amaxes(amaxes) -> list:
    return [float(a) for a in amaxes]          # "inf" and "nan" are strings in the JSON cases


def _produce(student, amaxes, fp8_amax_history_len=4, fp8_amax_compute_algo="max", fp8_margin=0, fp8_max=448.0):
    import torch
    fn = student.load()["update"]
    history, scale = torch.zeros(fp8_amax_history_len), torch.tensor(1.0)
    out = {"history": [], "scale": []}
    with student.banning(OWN, WHY):
        for step, a in enumerate(_amaxes(amaxes)):
            got, bad = call(fn, history.clone(), torch.tensor(a), scale.clone(), fp8_amax_history_len=fp8_amax_history_len,
                            fp8_amax_compute_algo=fp8_amax_compute_algo, fp8_margin=fp8_margin, fp8_max=fp8_max)
            if bad:
                return dict(bad, detail=f"at step {step + 1}: {bad['detail']}")
            if not (isinstance(got, tuple) and len(got) == 2 and all(type(t) is torch.Tensor for t in got)):
                return failure("invalid", f"step {step + 1}: amax_update returned {type(got).__name__}, not "
                               "(history, scale): two tensors")
            history, scale = (t.detach().clone() for t in got)
            if history.dtype != torch.float32 or scale.dtype != torch.float32 or scale.numel() != 1:
                return failure("invalid", f"step {step + 1}: history {history.dtype}, scale {scale.dtype} of "
                               f"{scale.numel()} elements: expected fp32 tensors, the scale one number")
            out["history"].append(history)
            out["scale"].append(scale.reshape(()))
    return out


def _same(a, b) -> bool:
    """Bit for bit, any NaN equal to any NaN (NaN payloads do not survive the JSON wire)."""
    import torch
    a, b = a.float(), b.float()
    return a.shape == b.shape and bool(((a.view(torch.int32) == b.view(torch.int32)) | (a.isnan() & b.isnan())).all())


def _hint(algo: str, margin: int, fp8_max: float, history, prev: float, got: float, want: float) -> str:
    """The rule a wrong scale breaks: the other algo's choice, the 0/non-finite rule, the margin."""
    import torch

    def scale(a: float, m: int = margin) -> float:          # labkit's rule, for one chosen amax
        return float((torch.tensor(fp8_max) / torch.tensor(a)) / 2.0 ** m) if 0 < a < float("inf") else prev
    chosen = float(history.max() if algo == "max" else history[0])
    other = float(history[0] if algo == "max" else history.max())
    if got == scale(other) != want:
        return (f"fp8_amax_compute_algo={algo!r} chooses {chosen:g}, the "
                + ("largest amax of the history" if algo == "max" else "history's first (most recent) entry"))
    if not 0 < chosen < float("inf"):
        return (f"the chosen amax is {chosen:g}: when it is 0 or not finite, Transformer Engine keeps the "
                f"previous scale ({prev:.7g})")
    if got == float((fp8_max / torch.tensor(chosen)) / 2.0 ** margin):    # torch: 448.0 / a = 448 * (1 / a)
        return ("compute fp8_max / amax as a division of two tensors (torch.full_like(amax, fp8_max) / amax): "
                "torch computes a Python float over a tensor as fp8_max * (1 / amax), which rounds twice")
    if margin and got == scale(chosen, 0):
        return f"divide by 2**fp8_margin = {2 ** margin}: the margin keeps headroom under {fp8_max:g}"
    return f"scale = ({fp8_max:g} / amax) / 2**{margin} in fp32 (tensor / tensor), with amax = {chosen:g}: {want:.7g}"


def _judge(data, amaxes, fp8_amax_history_len=4, fp8_amax_compute_algo="max", fp8_margin=0, fp8_max=448.0):
    import torch

    from ..fp8 import Format
    from ..fp8.scaling import DelayedScaling
    algo, length, margin = fp8_amax_compute_algo, fp8_amax_history_len, fp8_margin
    name = f"amax_update (history {length}, {algo!r}, margin {margin}" + (
        f", max {fp8_max:g})" if fp8_max != 448.0 else ")")
    bad = failed(name, data, "amax_update returns (history, scale): two fp32 tensors")
    if bad is not None:
        return bad
    steps = _amaxes(amaxes)
    if not (isinstance(data, dict) and len(data.get("history", [])) == len(steps) == len(data.get("scale", []))):
        return report(name, False, f"expected a history and a scale for each of the {len(steps)} steps")
    fmt = Format("fp8", torch.float8_e4m3fn, 4, 3, 7, fp8_max, 0.0, 0.0)     # only its max is read
    ref = DelayedScaling(fmt, length, algo, margin)
    for step, a in enumerate(steps, start=1):
        prev = float(ref.scale)
        ref.update(torch.tensor(a))
        want_h = torch.cat([ref.history, torch.zeros(length - ref.history.numel())])
        got_h, got_s = data["history"][step - 1], data["scale"][step - 1]
        before = ", ".join(f"{v:g}" for v in steps[max(0, step - 1 - length):step - 1])
        where = f"step {step} (amax {a:g}" + (f", after {before})" if before else ", the first)")
        if not _same(got_h, want_h):
            shown = [round(float(v), 6) for v in got_h.flatten()[:8]]
            return report(name, False, f"{where}: history {shown}, expected {[round(float(v), 6) for v in want_h[:8]]}",
                          f"most recent first, {length} long: torch.roll(history, 1), then history[0] = amax "
                          "(the oldest amax falls off the end)")
        if not _same(got_s, ref.scale):
            ulps = abs(int(got_s.float().view(torch.int32)) - int(ref.scale.view(torch.int32)))
            apart = " (1 unit in the last place apart)" if ulps == 1 else ""
            return report(name, False, f"{where}: scale {float(got_s):.9g}, expected {float(ref.scale):.9g}{apart}",
                          _hint(algo, margin, fp8_max, want_h, prev, float(got_s), float(ref.scale)))
    special = [w for w, on in (("0", any(a == 0 for a in steps)), ("inf", any(a == float("inf") for a in steps)),
                               ("NaN", any(a != a for a in steps))) if on]
    return report(name, True, f"history and scale equal labkit's DelayedScaling at each of the {len(steps)} steps"
                  + (f" (amaxes {', '.join(special)} included)" if special else ""))


AMAX_UPDATE = Spec(
    "amax-update", {"update": "amax_update"}, _produce, _judge, nonfinite=True, forbid=OWN, why=WHY,
    cases=({"amaxes": [1.0, 3.3, 0.25, 0.0, 2.0, 0.125, 0.5, 0.7, 6.0, 0.01],
            "fp8_amax_history_len": 4, "fp8_amax_compute_algo": "max", "fp8_margin": 0},
           {"amaxes": [2.0, 0.0, 5.0, "inf", 1.5, 0.3, 0.3],
            "fp8_amax_history_len": 3, "fp8_amax_compute_algo": "most_recent", "fp8_margin": 1}),
    hints=("new = torch.roll(history, 1); new[0] = amax: most recent first, the oldest falls off",
           "a = new.max() for 'max', new[0] for 'most_recent'; sf = (fp8_max / a) / 2 ** fp8_margin",
           "torch.where(a > 0, sf, scale), then torch.where(torch.isfinite(a), that, scale): 0, inf and NaN "
           "keep the previous scale"))


def amax_update(fn) -> bool:
    """Run ``fn`` on the visible cases ("max" and "most_recent"); print one [check] line each."""
    from .spec import run
    return all([bool(run(AMAX_UPDATE, {"update": fn}, **case)) for case in AMAX_UPDATE.cases])

"""Exercise checks: run a student's code on N ranks against a reference and say what differs.

Every check prints one line that starts with ``[check]`` and returns a :class:`CheckResult`:

    [check] PASS ring_all_reduce (4 ranks): equals dist.all_reduce exactly
    [check] FAIL ring_all_reduce (4 ranks): rank 2, element 5: got 3.0, expected 6.0
            hint: the values differ: compare what each rank does with the chunk it receives

Rules every check follows (issues 13 and 23 of the course):

- **Write the mechanism, do not call it.** labkit's own implementation of what the exercise asks
  for raises :class:`Forbidden` while the student's code runs: in the notebook only during the
  check (:func:`forbidden`); when grading, for good, before the answer cells' source even runs
  (:mod:`labkit.check.bans`).
- **Compare with an independent reference** (the dense single-device model, ``dist`` collectives,
  ``F.cross_entropy``, a formula from the paper), built where the student's code never ran: each
  exercise is a :class:`~labkit.check.spec.Spec`, a ``produce`` that runs the student's code and
  returns plain data and a ``judge`` that compares (:mod:`labkit.check.spec`).
- **Count every byte below labkit**: the ranks run on a process group that counts each collective
  on every group (:mod:`labkit.check.instrument`), so ``torch.distributed`` called directly is
  counted like ``labkit.comm``.
- **Say what differs; hints on request.** A FAIL names the rank, the tensor, the element and the
  classic bug it looks like; ``check.hint("exercise-id")`` reveals the exercise's hints one at a
  time (:mod:`labkit.check.hints`).

One module per lab (collectives.py, data_parallel.py and zero.py, tensor_parallel.py and
tp_blocks.py, sequence_parallel.py, pipeline.py and pipeline_loop.py, context_parallel.py,
expert_parallel.py, composition.py and capstone.py, memory_knobs.py, debugging.py,
native.py, fp8.py and fp8_delayed.py, roofline.py); :mod:`labkit.check.example` is the smallest
lab, for instructors; :mod:`labkit.check.runner` runs one exercise in the grader's sandbox.
"""
from __future__ import annotations

import contextlib
import importlib
from dataclasses import dataclass


@dataclass
class CheckResult:
    name: str
    passed: bool
    message: str
    hint: str = ""

    def line(self) -> str:
        head = f"[check] {'PASS' if self.passed else 'FAIL'} {self.name}: {self.message}"
        return head if self.passed or not self.hint else f"{head}\n        hint: {self.hint}"

    def __bool__(self) -> bool:
        return self.passed


def report(name: str, passed: bool, message: str, hint: str = "") -> CheckResult:
    """Print the result line and return it."""
    result = CheckResult(name, bool(passed), message, hint)
    print(result.line())
    return result


# -- forbidding labkit's own implementation (in the notebook: during the check only) -----------
class Forbidden(RuntimeError):
    """Raised by labkit code that an exercise asks the student to write instead of calling."""


def _raiser(*args, **kwargs):  # its code object replaces a forbidden function's code
    raise __import__("labkit.check", fromlist=["Forbidden"]).Forbidden(
        __import__("sys")._getframe(0).f_code.co_qualname)


def _forbidden_method(what: str):
    def method(*args, **kwargs):
        raise Forbidden(what)
    return method


@contextlib.contextmanager
def forbidden(*targets: str, why: str = "this exercise asks you to write it yourself"):
    """Make each target raise :class:`Forbidden` inside the block, then restore it.

    A target is ``"module:attribute"`` or ``"module:Class.attribute"``. A plain function keeps its
    identity and gets a raising code object, so references the student imported earlier
    (``from labkit.comm import all_reduce``) raise too; class attributes (methods, an autograd
    Function's ``forward``) and functions with a closure are replaced on their owner. (References
    taken *before* the block to a class attribute still work here; grading bans first.)
    """
    undo = []
    try:
        for target in targets:
            module_name, _, path = target.partition(":")
            owner = importlib.import_module(module_name)
            *parents, attr = path.split(".")
            for name in parents:
                owner = getattr(owner, name)
            fn = getattr(owner, attr)
            message = f"{module_name}.{path} is disabled during this check: {why}"
            code = getattr(fn, "__code__", None)
            if code is not None and not code.co_freevars and not isinstance(owner, type):
                undo.append((fn, "__code__", code, False))
                fn.__code__ = _raiser.__code__.replace(co_name=message, co_qualname=message)
            else:
                raw = owner.__dict__.get(attr) if isinstance(owner, type) else fn
                undo.append((owner, attr, raw, True))
                replacement = _forbidden_method(message)
                if isinstance(raw, staticmethod):
                    replacement = staticmethod(replacement)
                setattr(owner, attr, replacement)
        yield
    finally:
        for obj, attr, old, is_attr in reversed(undo):
            setattr(obj, attr, old)


# -- comparing ------------------------------------------------------------------------------------
def describe_mismatch(got, expected, atol: float = 0.0, rtol: float = 0.0, what: str = "") -> str | None:
    """None when ``got`` equals ``expected`` within tolerances, else where and by how much it differs."""
    import torch
    try:
        got = torch.as_tensor(got)
    except Exception:  # noqa: BLE001 - not a tensor at all
        return f"{what}got a {type(got).__name__}, expected a tensor of shape {tuple(torch.as_tensor(expected).shape)}"
    expected = torch.as_tensor(expected)
    if got.shape != expected.shape:
        return f"{what}shape {tuple(got.shape)}, expected {tuple(expected.shape)}"
    if got.dtype != expected.dtype:
        got = got.to(expected.dtype)
    diff = (got.double() - expected.double()).abs()
    bad = (diff > atol + rtol * expected.double().abs()) | (got.double().isnan() != expected.double().isnan())
    bad &= ~(got.double().isnan() & expected.double().isnan())
    if not bool(bad.any()):
        return None
    i = int(bad.flatten().nonzero()[0])
    idx = tuple(int(v) for v in torch.unravel_index(torch.tensor(i), got.shape)) if got.dim() else ()
    return (f"{what}element {idx}: got {got.flatten()[i].item():.6g}, expected "
            f"{expected.flatten()[i].item():.6g} (max abs diff {diff.nan_to_num(float('inf')).max().item():.3g}, "
            f"{int(bad.sum())} of {bad.numel()} elements off)")


def sent(counts: dict, *ops: str) -> float:
    """Bytes one rank sent in ``ops`` (all ops when none named), from a counting-group snapshot."""
    return float(sum(v.get("bytes", 0.0) for op, v in counts.items() if not ops or op in ops))


def collective_ops(counts: dict) -> list[str]:
    """The collective ops (not point-to-point) a counting-group snapshot saw."""
    return sorted(op for op in counts if op not in ("send", "recv"))

"""Exercise checks: run a student's code on N ranks against a reference and say what differs.

Every check prints one line that starts with ``[check]`` (the grader, ``python -m labkit.notebooks
grade``, collects them) and returns a :class:`CheckResult`:

    [check] PASS ring_all_reduce (4 ranks): equals dist.all_reduce exactly
    [check] FAIL ring_all_reduce (4 ranks): rank 2, element 5: got 3.0, expected 6.0
            hint: (1 of 3) the values differ: compare what each rank does with the chunk it receives

Three rules every check follows (issue 13 of the course):

- **Write the mechanism, do not call it.** While the student's code runs, labkit's own
  implementation of what the exercise asks for is replaced by a function that raises
  :class:`Forbidden` (:func:`forbidden`), so calling it fails with a message that says so.
- **Compare with an independent reference**: the dense single-device model, ``dist`` collectives,
  ``F.cross_entropy``, a formula from the paper; never the code the student was asked to write.
- **Hints escalate** (:func:`hint`): the first failure of an exercise says what differs; each
  further failure of the same exercise (same check, same function name) says more, up to the
  last hint, which names the idea to use. The grader runs each check once: it shows hint 1.

Topic checks live next to this file, one per lab (collectives.py, data_parallel.py and zero.py,
tensor_parallel.py, sequence_parallel.py, pipeline.py, context_parallel.py, expert_parallel.py,
composition.py); this module holds what they share.
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


# -- escalating hints -------------------------------------------------------------------------
FAILURES: dict = {}   # (check, student function's qualified name, hint kind) -> failures so far


def hint(check: str, student_fn, hints, kind: str = "") -> str:
    """The hint for this failure: ``hints[k]`` at the (k+1)-th failure of ``student_fn`` in ``check``.

    ``hints`` goes from "what differs" to "which idea to use"; the last one repeats. ``kind``
    separates failures of different nature in one check (values, bytes, ...). Counted per
    function name, so re-running a corrected cell continues the count; ``reset_hints()`` restarts.
    """
    hints = [hints] if isinstance(hints, str) else list(hints)
    key = (check, getattr(student_fn, "__qualname__", repr(student_fn)), kind)
    k = FAILURES.get(key, 0)
    FAILURES[key] = k + 1
    text = hints[min(k, len(hints) - 1)]
    return f"({min(k, len(hints) - 1) + 1} of {len(hints)}) {text}" if len(hints) > 1 else text


def reset_hints() -> None:
    FAILURES.clear()


# -- forbidding labkit's own implementation ---------------------------------------------------
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
    Function's ``forward``) and functions with a closure are replaced on their owner.
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


# -- comparing and running --------------------------------------------------------------------
def describe_mismatch(got, expected, atol: float = 0.0, rtol: float = 0.0, what: str = "") -> str | None:
    """None when ``got`` equals ``expected`` within tolerances, else where and by how much it differs."""
    import torch
    got, expected = torch.as_tensor(got), torch.as_tensor(expected)
    if got.shape != expected.shape:
        return f"{what}shape {tuple(got.shape)}, expected {tuple(expected.shape)}"
    if got.dtype != expected.dtype:
        got = got.to(expected.dtype)
    diff = (got.double() - expected.double()).abs()
    bad = diff > atol + rtol * expected.double().abs()
    if not bool(bad.any()):
        return None
    i = int(bad.flatten().nonzero()[0])
    idx = tuple(int(v) for v in torch.unravel_index(torch.tensor(i), got.shape)) if got.dim() else ()
    return (f"{what}element {idx}: got {got.flatten()[i].item():.6g}, expected "
            f"{expected.flatten()[i].item():.6g} (max abs diff {diff.max().item():.3g}, "
            f"{int(bad.sum())} of {bad.numel()} elements off)")


def run_student(name: str, fn, world_size: int, *args, **kwargs):
    """``labkit.launch`` that turns a crash of the student's code into a failed check.

    Returns (results, None) or (None, CheckResult). ``student_fn`` (keyword) names the function
    whose hints escalate; a :class:`Forbidden` call gets a hint of its own.
    """
    from ..launcher import LaunchTimeout, RankFailed, launch
    student_fn = kwargs.pop("student_fn", fn)
    kwargs.setdefault("backend", "gloo")   # exercises build CPU tensors; on a GPU node pass "nccl"
    try:
        return launch(fn, world_size, *args, timeout=kwargs.pop("timeout", 60.0), **kwargs), None
    except RankFailed as e:
        # the exception line, not the launcher's "(ranks [...] failed too ...)" note after it
        last = [ln for ln in e.remote_traceback.strip().splitlines()
                if ln.strip() and not ln.startswith("(ranks ")][-1]
        if last.startswith("NotImplementedError"):   # the stub, on every rank: no rank to name
            return None, report(name, False, f"your code raised {last}",
                                "the exercise is not written yet: replace the raise by your code")
        if "Forbidden" in last:
            return None, report(name, False, "your code called labkit's own implementation: "
                                f"{last.split(': ', 1)[-1]}",
                                "write the mechanism with the building blocks the exercise names")
        return None, report(name, False, f"rank {e.rank} raised {last}",
                            "run the cell above on its own and read the traceback")
    except LaunchTimeout as e:
        return None, report(name, False, f"ranks {e.unfinished} hung (timed out)",
                            "a send without a matching recv, or a collective that not every rank calls")

"""Checks written before :class:`~labkit.check.spec.Spec` (in-process, escalating hints).

The PyTorch-native lab checks this way (``labkit.check.native``; the memory-knobs and debugging
labs moved to Specs): the check runs in the notebook (or, when grading, in the sandbox, its printed
``[check]`` lines read by the grader: ``labkit.check.registry.IN_PROCESS``). A failure's hint escalates with each failure of the same
function (``hint``); ``run_student`` turns a crash of the student's code into a failed check.
"""
from __future__ import annotations

from . import report

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

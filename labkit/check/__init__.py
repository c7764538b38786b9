"""Exercise checks: run a student's code on N ranks against a reference and say what differs.

Every check prints one line that starts with ``[check]`` (the grader, ``python -m labkit.notebooks
grade``, collects them) and returns a :class:`CheckResult`:

    [check] PASS ring_all_reduce (4 ranks): equals dist.all_reduce exactly
    [check] FAIL ring_all_reduce (4 ranks): rank 2, element 5: got 3.0, expected 6.0
            hint: in the reduce-scatter phase each rank must ADD the chunk it receives

Topic checks live next to this file (collectives.py, data_parallel.py, tensor_parallel.py,
pipeline.py); this module holds what they share.
"""
from __future__ import annotations

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

    Returns (results, None) or (None, CheckResult).
    """
    from ..launcher import LaunchTimeout, RankFailed, launch
    try:
        return launch(fn, world_size, *args, timeout=kwargs.pop("timeout", 60.0), **kwargs), None
    except RankFailed as e:
        # the exception line, not the launcher's "(ranks [...] failed too ...)" note after it
        last = [ln for ln in e.remote_traceback.strip().splitlines()
                if ln.strip() and not ln.startswith("(ranks ")][-1]
        return None, report(name, False, f"rank {e.rank} raised {last}",
                            "run the cell above on its own and read the traceback")
    except LaunchTimeout as e:
        return None, report(name, False, f"ranks {e.unfinished} hung (timed out)",
                            "a send without a matching recv, or a collective that not every rank calls")

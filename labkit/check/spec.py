"""A graded exercise as data: what runs the student's code (``produce``) and what judges it (``judge``).

Every exercise of a lab is a :class:`Spec`. ``produce(student, **case)`` runs the student's code
(on one process or on gloo ranks) on the inputs the case names and returns *plain data*: tensors,
numbers, the bytes the ranks sent (counted below labkit by :mod:`labkit.check.instrument`).
``judge(data, **case)`` builds the independent reference and compares: it never runs the student's
code, so it can run where no student code ever ran.

* In the notebook, a check such as ``check.conjugates(my_f, my_f_bar)`` runs both here, with the
  student's objects (:class:`Live`), and prints one ``[check]`` line.
* When grading (``python -m labkit.notebooks grade``), ``produce`` runs in a sandboxed process
  (``python -m labkit.check.runner``) that receives only the source of the answer cells
  (:class:`Source`): labkit's implementation of the exercise is banned (:mod:`labkit.check.bans`)
  and the counting process group installed before that source runs, in the runner and in every
  rank. Its data comes back as JSON (:mod:`labkit.check.wire`) and ``judge`` runs in the grader.

A case is a dict of keyword arguments for both; ``Spec.cases`` are the visible ones (the check
cell's), the hidden ones (other shapes, world sizes, seeds) live next to the masters, outside what
the sandbox mounts (``solutions/hidden/<lab>.json``).
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Callable

from . import CheckResult, Forbidden, report


@dataclass(frozen=True)
class Spec:
    id: str                      # the exercise id of the master's metadata ("conjugates")
    names: dict                  # role -> name the answer cells define, e.g. {"f": "my_f"}
    produce: Callable            # produce(student, **case) -> plain data
    judge: Callable              # judge(data, **case) -> CheckResult
    cases: tuple = ()            # visible cases (dicts), as the check cell runs them
    forbid: tuple = ()           # labkit targets banned before the student's source runs
    hints: tuple = ()            # revealed one at a time by check.hint(id)
    ranks: bool = False          # produce launches ranks, which load the source themselves
    why: str = "this exercise asks you to write it yourself"
    nonfinite: bool = False      # NaN/inf may be part of an honest answer (else refused before judging)
    per_rank: bool = True        # with ranks: the data is a list of one result per rank of the case

    def verdict(self, data, **case) -> CheckResult:
        """``judge``, behind one gate every exercise shares: data of exact plain types, finite, of
        bounded size (:func:`labkit.check.compare.refuse`), else a FAIL that names what it holds."""
        from .compare import refuse
        why = refuse(data, self.nonfinite)
        if why:
            return report(self.id, False, f"your answer holds {why}: not an answer this check takes",
                          "return plain numbers and tensors, finite, of the form the exercise's stub gives")
        n = case.get("world_size", case.get("cp"))
        if self.ranks and self.per_rank and type(n) is int and not (type(data) is dict and "failed" in data) and (
                type(data) is not list or len(data) != n):   # the rank count is the case's, never the answer's
            return report(self.id, False, f"expected one result per rank ({n} ranks), got "
                          f"{len(data) if type(data) is list else 'a ' + type(data).__name__}")
        return self.judge(data, **case)


# -- the student's code, as the process that runs it receives it -------------------------------
class Live:
    """The student's objects, in the notebook (shipped to ranks by value, as ``labkit.launch`` does)."""
    isolated = False

    def __init__(self, objects: dict):
        self.objects = objects

    def load(self) -> dict:
        return self.objects

    def banning(self, targets, why: str = ""):
        from . import forbidden
        return forbidden(*targets, why=why or Spec.why) if targets else contextlib.nullcontext()


class MissingName(LookupError):
    """The answer cells do not define a name the exercise needs."""


@dataclass
class Source:
    """The answer cells' source, for a fresh process: bans first, then setup cells, then answers."""
    setup: list
    answers: list                # [(where, source)], e.g. ("your cell 5", "def my_f(...): ...")
    names: dict
    forbid: tuple = ()
    why: str = Spec.why
    isolated = True
    _ns: dict | None = field(default=None, repr=False, compare=False)
    errors: list = field(default_factory=list, repr=False, compare=False)

    def __getstate__(self):                       # travels to ranks as text only
        return {k: v for k, v in self.__dict__.items() if k not in ("_ns", "errors")}

    def __setstate__(self, state):
        self.__dict__.update(state, _ns=None, errors=[])

    def run_cells(self, on_cell=None) -> dict:
        """Ban, then exec setup and answer cells into one namespace (once per process)."""
        if self._ns is None:
            from . import bans
            bans.install(self.forbid, self.why)
            ns = {"__name__": "__main__", "__builtins__": __builtins__}
            for i, src in enumerate(self.setup):
                exec(compile(src, f"<the lab's set-up cell {i + 1}>", "exec"), ns)   # noqa: S102 - the master's
            for i, (where, src) in enumerate(self.answers):
                if on_cell:
                    on_cell(i, where)
                try:
                    exec(compile(_plain_python(src), f"<{where}>", "exec"), ns)      # noqa: S102 - sandboxed
                except (Exception, SystemExit) as e:  # noqa: BLE001 - reported, the next cells still run
                    self.errors.append((where, short_error(e)))
            self._ns = ns
        return self._ns

    def load(self) -> dict:
        ns = self.run_cells()
        missing = [n for n in self.names.values() if n not in ns]
        if missing:
            raise MissingName(f"your answer cells define no {', '.join(missing)}"
                              + (f" ({self.errors[0][0]} raised {self.errors[0][1]})" if self.errors else ""))
        return {role: ns[name] for role, name in self.names.items()}

    def banning(self, targets, why: str = ""):
        return contextlib.nullcontext()          # banned for good before the source ran


def _plain_python(src: str) -> str:
    """IPython syntax (magics, ``!cmd``) as the Python IPython would run; else the source as is."""
    if not any(line.lstrip().startswith(("%", "!")) or line.rstrip().endswith("?")
               for line in src.splitlines()):
        return src                                  # plain Python: no need to import IPython (seconds)
    try:
        from IPython.core.inputtransformer2 import TransformerManager
        return TransformerManager().transform_cell(src)
    except Exception:  # noqa: BLE001 - no IPython, or a cell it cannot transform
        return src


def short_error(e: BaseException, limit: int = 300) -> str:
    """``"ValueError: message"``, at most ``limit`` characters (a message is the student's text)."""
    text = f"{type(e).__name__}: {e}"
    return text if len(text) <= limit else text[:limit - 3] + "..."


# -- running the student's code: failures become plain data -----------------------------------
def failure(kind: str, detail: str = "", **more) -> dict:
    """{"failed": kind, "detail": ...}: stub | forbidden | missing | raised | died | hung | invalid
    (the answer is not of the type the exercise asks for; ``detail`` says what it is)."""
    return {"failed": kind, "detail": detail[:600], **more}


def call(fn, *args, **kwargs):
    """(value, None) or (None, failure data) when the student's function raises."""
    try:
        return fn(*args, **kwargs), None
    except Forbidden as e:
        return None, failure("forbidden", str(e))
    except NotImplementedError as e:
        return None, failure("stub", short_error(e))
    except MissingName as e:
        return None, failure("missing", str(e))
    except Exception as e:  # noqa: BLE001 - the student's error is the message
        return None, failure("raised", short_error(e))


def ranks(worker, world_size: int, *args, timeout: float = 60.0):
    """``labkit.launch(worker, world_size, *args)`` on gloo; (results, None) or (None, failure)."""
    from ..launcher import LaunchTimeout, RankFailed, launch
    try:
        return launch(worker, world_size, *args, backend="gloo", timeout=timeout), None
    except RankFailed as e:
        lines = [ln for ln in e.remote_traceback.strip().splitlines()
                 if ln.strip() and not ln.startswith("(ranks ")]
        last = lines[-1] if lines else ""
        if last.startswith("process exited with code -"):
            return None, failure("died", last, rank=e.rank, signal=-int(last.split("code ")[1].split()[0]))
        kind = ("stub" if last.startswith("NotImplementedError") else "forbidden" if "Forbidden" in last
                else "missing" if "MissingName" in last else "raised")
        detail = last.split(": ", 1)[-1] if kind in ("forbidden", "missing") else last
        return None, failure(kind, detail, rank=e.rank)
    except LaunchTimeout as e:
        return None, failure("hung", f"ranks {e.unfinished} did not finish within {timeout:g} s",
                             ranks=e.unfinished)


_SIGNALS = {6: "SIGABRT", 9: "SIGKILL", 11: "SIGSEGV", 8: "SIGFPE", 7: "SIGBUS"}


def failed(title: str, data, hint: str = "") -> CheckResult | None:
    """The [check] FAIL line for failure data (None when ``data`` is not a failure)."""
    if not (isinstance(data, dict) and "failed" in data):
        return None
    kind, detail = data["failed"], data.get("detail", "")
    who = f"rank {data['rank']} " if "rank" in data else ""
    if kind == "stub":
        return report(title, False, f"your code raised {detail}",
                      "the exercise is not written yet: replace the raise by your code")
    if kind == "forbidden":
        return report(title, False, f"your code called labkit's own implementation: {detail}",
                      "write the mechanism with the building blocks the exercise names")
    if kind == "missing":
        return report(title, False, detail, "run your answer cell, and keep the names the exercise gives")
    if kind == "invalid":
        return report(title, False, detail, hint or "keep the form the exercise's stub gives")
    if kind == "hung":
        return report(title, False, f"{detail}: a hang", "a send without a matching recv, or a collective "
                      "that not every rank calls")
    if kind == "died":
        sig = data.get("signal")
        return report(title, False, f"{who}died with signal {sig} ({_SIGNALS.get(sig, 'a signal')}) and "
                      "no Python traceback: the process was killed or aborted inside a library",
                      "an abort in gloo usually means tensors or split sizes that do not match across "
                      "ranks; print each rank's sizes with labkit.launch(..., live_output=True)")
    return report(title, False, f"{who}raised {detail}", hint or "run your function on one case "
                  "in the notebook and read the traceback")


# -- the notebook: run both halves here ----------------------------------------------------------
def run(spec: Spec, objects: dict, **case) -> CheckResult:
    """Run ``spec`` on the student's ``objects`` with ``case``; print and return its result."""
    from . import wire
    data = spec.produce(Live(objects), **case)
    return spec.verdict(wire.loads(wire.dumps(data)), **case)

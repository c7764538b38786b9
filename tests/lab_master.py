"""What the lab tests share: a lab's master notebook as the thing under test.

``LabMaster(master, hidden, setup, roles)``: ``solutions()`` {exercise id: the master's solution
source}; ``fn(source, name, *edits)`` the function ``name`` of that source after each (old, new) edit
(an edit that does not apply fails: a plant that misses is a bug of the test); ``cases(exercise)``
its visible and hidden cases; ``verdicts(exercise, fn, cases)`` each case's verdict, as the Spec's
``run`` gives it. ``roles``: {exercise id: (the Spec's role, the student's function name)}.
"""
from __future__ import annotations

import json
from pathlib import Path

from labkit.check.registry import find
from labkit.check.spec import run


class LabMaster:
    def __init__(self, master: Path, hidden: Path, setup: str, roles: dict, namespace: dict | None = None):
        self.master, self.hidden, self.setup, self.roles = master, hidden, setup, roles
        self.namespace = namespace or {}

    def solutions(self) -> dict:
        import nbformat                  # the notebook tools: a test module importorskips them first
        nb = nbformat.read(self.master, as_version=4)
        return {c.metadata["labkit"]["exercise"]: c.source for c in nb.cells
                if c.metadata.get("labkit", {}).get("role") == "solution" and "exercise" in c.metadata["labkit"]}

    def fn(self, source: str, name: str, *edits):
        for old, new in edits:
            assert old in source, old
            source = source.replace(old, new)
        ns = dict(self.namespace)
        exec(self.setup + source, ns)  # noqa: S102 - the master's own source, edited by the test
        return ns[name]

    def cases(self, exercise: str) -> list:
        return list(find(exercise).cases) + json.loads(self.hidden.read_text())[exercise]

    def verdicts(self, exercise: str, fn, cases=None) -> list:
        role = self.roles[exercise][0]
        return [run(find(exercise), {role: fn}, **case) for case in (cases or self.cases(exercise))]

    def check_plant(self, exercise: str, edits, case, words: str, hint: str) -> None:
        """The master's solution with ``edits`` planted fails case ``case`` (an index into visible +
        hidden; None: any) with ``words`` in its message and ``hint`` in its hint."""
        fn = self.fn(self.solutions()[exercise], self.roles[exercise][1], *edits)
        cases = self.cases(exercise)
        failed = [r for r in self.verdicts(exercise, fn, [cases[case]] if case is not None else cases) if not r]
        assert failed, f"the planted answer passed: {edits}"
        assert words in failed[0].message and hint in failed[0].hint, failed[0].line()

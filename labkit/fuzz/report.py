"""A finding, reported: the layout it was drawn as, the layout it shrank to, a reproducer file and
a one-line command, and ``labkit diverge``'s report of where it first leaves one device.

Chapter "Finding the bug nobody chose". The reproducer is a small JSON file
(``{"world_size", "implementation", "config", "steps", "bug", "problems"}``) and the command
``python -m labkit fuzz --replay FILE`` runs it again and judges it with the same oracle
(``run.replay``).
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass


@dataclass
class Finding:
    kind: str                # "grad", "loss", "bytes", "nonfinite", "crash"
    drawn: dict              # the layout as drawn
    shrunk: dict             # the smallest layout that still fails alike
    problems: list           # the oracle's problems on the shrunk layout
    index: int               # the finding's layout was the index-th drawn (1-based): the budget it took
    shrink_runs: int
    divergence: str | None   # labkit diverge's report on the shrunk layout (None: not comparable)
    reproducer: dict
    path: str | None = None  # where the reproducer was written
    command: str = ""

    def __str__(self) -> str:
        from .space import describe
        p = self.problems[0]
        lines = [f"finding ({self.kind}) at layout {self.index}: {describe(self.drawn)}",
                 f"  shrunk in {self.shrink_runs} runs to: {describe(self.shrunk)}",
                 f"  {p['what']}: error {p['error']:.3g}, bound {p['bound']:.3g}"]
        if self.divergence:
            lines.append("  diverge: " + self.divergence.replace("\n", "\n           "))
        lines.append(f"  reproduce: {self.command}")
        return "\n".join(lines)


def divergence_of(layout: dict, bug: str | None) -> str | None:
    """``first_divergence`` of the shrunk layout (labkit's implementation, float64, no dropout),
    as text; None where it cannot compare (another implementation, float32, dropout, a crash)."""
    c = layout["config"]
    if layout["implementation"] != "labkit" or c.get("params_dtype") != "float64" or c.get("hidden_dropout"):
        return None
    from ..debug.divergence import first_divergence
    try:
        d = first_divergence(layout["world_size"], inject=bug, steps=1, compare_collectives=True, **c)
    except Exception as e:          # the layout crashes: the crash is the report
        return f"diverge could not run: {type(e).__name__}: {str(e).splitlines()[-1][:200] if str(e) else ''}"
    return "no divergence in iteration 1 (the problem is in a later iteration or in the bytes)" if d is None else str(d)


def make_finding(drawn_outcome, small, seed: int, index: int, bug: str | None, steps: int, diverge: bool = True,
                 out: str | None = None) -> Finding:
    kind = small.problems[0]["kind"]
    repro = {"world_size": small.layout["world_size"], "implementation": small.layout["implementation"],
             "config": small.layout["config"], "steps": steps, "bug": bug, "seed": seed,
             "problems": [{k: (v if not isinstance(v, float) or v == v and abs(v) != float("inf") else str(v))
                           for k, v in p.items()} for p in small.problems[:5]]}
    div = divergence_of(small.layout, bug) if diverge and kind != "crash" else None
    path = None
    if out is not None:
        os.makedirs(out, exist_ok=True)
        path = os.path.join(out, f"finding-{seed}-{index}-{kind}.json")
        with open(path, "w") as f:
            json.dump({**repro, "divergence": div}, f, indent=1, default=str)
    command = f"python -m labkit fuzz --replay {path or 'FINDING.json'}"
    return Finding(kind, drawn_outcome.layout, small.layout, small.problems, index, getattr(small, "shrink_runs", 0),
                   div, repro, path, command)


def summary(result) -> str:
    """The run's counts, layouts per minute, the cost by world size, and each finding."""
    c = result.counts()
    ran = c.get("ok", 0) + c.get("finding", 0)
    ran += c.get("known", 0)
    known = sorted({o.rule for o in result.outcomes if o.status == "known"})
    lines = [f"seed {result.seed}: {c['drawn']} layouts drawn, {c.get('refused', 0)} refused by a named rule, "
             f"{ran} run, {len(result.findings)} new finding(s)"
             + (f", {c['known']} matching known finding(s) {known}" if known else "") + f", in {result.seconds:.0f} s "
             f"({60 * c['drawn'] / max(result.seconds, 1e-9):.1f} layouts/min drawn, "
             f"{60 * ran / max(result.seconds, 1e-9):.1f} run/min)"]
    lines += [f"  world {w}: {n} run, {s:.1f} s each" for w, (n, s) in result.by_world().items()]
    lines += [str(f) for f in result.findings]
    return "\n".join(lines)

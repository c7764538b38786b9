"""Read a rank's Python stack dump (faulthandler) and say which collective it waits in.

Chapter "When training goes wrong", section "Hangs". When a launch times out, ``labkit.launch``
asks every rank still running for its stacks (SIGUSR1, which each rank registered with
``faulthandler``: the dump is written from C, so it works while the rank is blocked inside gloo or
NCCL), then names for each the innermost ``torch.distributed`` call and the code that made it:

    rank 0 waits in all_reduce (fn, line 12 <- launch_rank.py rank_main)
    rank 1 waits in barrier (launch_rank.py rank_main): it finished its function and waits for the others

Layer 1 of labkit (pure Python): the launcher imports it.
"""
from __future__ import annotations

import re

_HEADER = re.compile(r"^(Current thread|Thread) (0x[0-9a-f]+)[^\n]*\(most recent call first\):", re.M)
_FRAME = re.compile(r'^\s+File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)', re.M)
_TORCH_DIST = ("torch/distributed/distributed_c10d.py",)
_SKIP = ("torch/distributed/",)


def threads(dump: str) -> list[list[tuple[str, int, str]]]:
    """Every thread of a faulthandler dump: [[(file, line, function), ...] innermost first]."""
    starts = [m.start() for m in _HEADER.finditer(dump)] + [len(dump)]
    return [[(m["file"].replace("\\", "/"), int(m["line"]), m["func"]) for m in _FRAME.finditer(dump[a:b])]
            for a, b in zip(starts, starts[1:])]


def _frame(path: str, line: int, func: str) -> str:
    """labkit's and Python's own frames by file; the caller's code (a notebook cell, a script)
    by function and line only, so the report reads the same wherever it ran; the launcher's
    ``rank_main`` (where every rank's function is called) without a line: it says nothing."""
    if path.endswith("/labkit/launch_rank.py") and func == "rank_main":
        return "launch_rank.py rank_main"
    if "/labkit/" in path:
        where = path.split("/labkit/")[-1]
    elif "/site-packages/" in path:
        where = path.split("/site-packages/")[-1]
    elif "/lib/python" in path:                       # the standard library: lib/python3.11/x.py
        where = path.split("/lib/python")[-1].split("/", 1)[-1]
    else:
        return f"{func}, line {line}"
    return f"{where}:{line} {func}"


def waits_from_stacks(dump: str) -> dict | None:
    """{"op", "site", "finished"} for the rank's main thread (the one running ``rank_main``), or
    None if ``dump`` holds no stack. ``op``: the innermost torch.distributed function (or, for a
    blocked ``wait()``, the innermost Python function); ``site``: the two frames that called it;
    ``finished``: the rank returned from its function and waits in the launcher's final barrier."""
    stacks = threads(dump)
    if not any(stacks):
        return None
    main = next((s for s in stacks if any(f == "rank_main" for _, _, f in s)), None) or \
        next((s for s in stacks if s), [])
    dist_frames = [f for f in main if f[0].endswith(_TORCH_DIST)]
    op = dist_frames[0][2] if dist_frames else main[0][2]
    callers = [f for f in main if not any(k in f[0] for k in _SKIP)]
    shown = callers[:next((i + 1 for i, f in enumerate(callers) if f[2] == "rank_main"), 2)][:2]
    site = " <- ".join(_frame(*f) for f in shown)
    finished = bool(callers) and callers[0][2] == "rank_main"
    return {"op": op, "site": site, "finished": finished}


def describe(rank: int, wait: dict | None) -> str:
    """One line of the launcher's hang report."""
    if wait is None:
        return f"rank {rank}: no stack dump (it may be blocked outside Python, or already gone)"
    tail = ": it finished its function and waits for the others" if wait["finished"] else ""
    return f"rank {rank} waits in {wait['op']} ({wait['site']}){tail}"

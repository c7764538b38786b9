"""In-job restart: when a rank dies, tear every rank down, relaunch, resume from the last checkpoint.

Chapter "When training goes wrong", section "Ranks that die". ``labkit.train(save=DIR,
save_interval=K, max_restarts=R)`` (``python -m labkit train --save DIR --save-interval K
--max-restarts R``) runs the job; when a rank fails (killed by any signal, SIGKILL included, an
exception, a collective that timed out: the launcher's :class:`RankFailed`), every other rank is
stopped (a collective cannot go on without one of its members), the ranks are launched again with
``load=DIR`` and training goes on from the last *complete* checkpoint (the tracker's: a save killed
halfway leaves only an ``iter_N.partial`` folder, which never loads). Each event is logged: which
rank, why, the iteration reached and the iterations lost. Under ``torchrun --max-restarts`` the
agent does the relaunch and the same ``--load DIR --save DIR`` does the resume.

Faults on purpose, for the tests and the lab (:class:`Fault`; ``faults=`` or the environment
variable ``LABKIT_FAULTS``, e.g. ``"1@3,0@6:save:SIGTERM"``): rank r fails when it is about to run
iteration i (``at="step"``: i iterations done), or while it writes the checkpoint of iteration i
(``at="save"``: its files written, the folder not yet renamed), by SIGKILL (default), SIGTERM, an
exception, or a hang (its peers' collectives time out). Each fault fires once: it leaves a marker
file in ``DIR/.faults`` before it acts, so the relaunched job does not fail again at the same point.

Goodput (:func:`account`): rank 0 reports every iteration's loss and time and every save's blocking
time to the caller as it goes; wall time splits into useful steps (each iteration once, the run that
counted), recomputed steps (done, then lost with a kill before the next checkpoint), save blocking,
the first start-up and restarts (failure detection, teardown, relaunch, load, the interrupted step).
"""
from __future__ import annotations

import dataclasses
import os
import signal
import sys
import time
from pathlib import Path

from .validate import int_at_least

HOWS = ("SIGKILL", "SIGTERM", "exception", "hang")
ATS = ("step", "save")
MARKERS = ".faults"


@dataclasses.dataclass(frozen=True)
class Fault:
    """Rank ``rank`` fails at iteration ``iteration`` (``at`` "step": before running it, i.e. with
    ``iteration`` done; "save": while writing the checkpoint of that iteration), by ``how``."""

    rank: int
    iteration: int
    at: str = "step"
    how: str = "SIGKILL"

    def __post_init__(self):
        for name in ("rank", "iteration"):
            int_at_least(f"fault {name}", getattr(self, name), 0)
        if self.at not in ATS:
            raise ValueError(f"fault at must be one of {ATS}, got {self.at!r}")
        if self.how not in HOWS:
            raise ValueError(f"fault how must be one of {HOWS}, got {self.how!r}")

    @property
    def name(self) -> str:
        return f"rank{self.rank}-{self.at}{self.iteration}-{self.how}"


def parse_faults(text: str | None) -> list[Fault]:
    """"RANK@ITER[:step|save][:SIGKILL|SIGTERM|exception|hang]", comma-separated; "" -> []."""
    out = []
    for item in (text or "").replace(" ", "").split(","):
        if not item:
            continue
        head, *rest = item.split(":")
        try:
            rank, it = (int(x) for x in head.split("@"))
        except ValueError:
            raise ValueError(f"fault {item!r}: expected RANK@ITERATION[:step|save][:how]") from None
        at = next((r for r in rest if r in ATS), "step")
        how = next((r for r in rest if r in HOWS), "SIGKILL")
        unknown = [r for r in rest if r not in ATS + HOWS]
        if unknown:
            raise ValueError(f"fault {item!r}: unknown {unknown}; at is one of {ATS}, how one of {HOWS}")
        out.append(Fault(rank, it, at, how))
    return out


def check(max_restarts, save) -> None:
    """ValueError for a bad ``max_restarts``, or one without a ``save`` folder to resume from."""
    int_at_least("max_restarts", max_restarts, 0)
    if max_restarts and save is None:
        raise ValueError(f"max_restarts {max_restarts} without save: a restart resumes from the checkpoints in save")


def faults_of(faults, save) -> list[dict]:
    """Checked faults (a list of Fault, a string, or None: ``LABKIT_FAULTS``) with marker paths."""
    if faults is None:
        faults = os.environ.get("LABKIT_FAULTS", "")
    if isinstance(faults, str):
        faults = parse_faults(faults)
    faults = [f if isinstance(f, Fault) else Fault(*f) for f in faults]
    if faults and save is None:
        raise ValueError("faults need save=DIR: their markers (each fires once) live in DIR/.faults")
    return [{"fault": f, "marker": str(Path(save) / MARKERS / f.name)} for f in faults]


def maybe_fail(faults, rank: int, iteration: int, at: str) -> None:
    """In a rank: act out the fault planned here, once (its marker written first, durably)."""
    for entry in faults or ():
        f = entry["fault"]
        if (f.rank, f.iteration, f.at) != (rank, iteration, at) or os.path.exists(entry["marker"]):
            continue
        os.makedirs(os.path.dirname(entry["marker"]), exist_ok=True)
        fd = os.open(entry["marker"], os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        os.write(fd, f"{time.time()}\n".encode())
        os.fsync(fd)
        os.close(fd)
        print(f"labkit fault: rank {rank} fails by {f.how} at {at} {iteration}", file=sys.stderr, flush=True)
        if f.how == "exception":
            raise RuntimeError(f"injected fault: rank {rank} at {at} {iteration}")
        if f.how == "hang":
            while True:                   # its peers' next collective times out
                time.sleep(3600)
        os.kill(os.getpid(), getattr(signal, f.how))
        time.sleep(60)                    # SIGTERM is delivered asynchronously


# -- the caller's side: a record of the run, the restart loop -------------------------------------
class Recorder:
    """on_message of every launch: rank 0's iteration and save reports, the other messages printed."""

    def __init__(self, on_message=print):
        self.on_message = on_message
        self.iterations: dict[int, dict] = {}     # iteration number (1-based) -> the latest report
        self.recomputed: list[dict] = []          # reports overwritten by a later attempt
        self.saves: list[dict] = []
        self.attempt = 0
        self.mismatch: list[int] = []             # recomputed iterations whose loss differed

    def __call__(self, msg) -> None:
        if isinstance(msg, dict) and "labkit.iteration" in msg:
            it, msg = msg["labkit.iteration"], dict(msg, attempt=self.attempt)
            old = self.iterations.get(it)
            if old is not None:
                self.recomputed.append(old)
                if old["loss"] != msg["loss"]:
                    self.mismatch.append(it)
            self.iterations[it] = msg
        elif isinstance(msg, dict) and "labkit.save" in msg:
            self.saves.append(dict(msg, attempt=self.attempt))
        elif self.on_message is not None:
            self.on_message(msg)

    def reached(self) -> int:
        mine = [it for it, m in self.iterations.items() if m["attempt"] == self.attempt]
        return max(mine, default=0)


def why(err) -> str:
    """One line: why the rank failed (a signal, an exception, a collective timeout)."""
    from .launch_collect import LaunchTimeout
    if isinstance(err, LaunchTimeout):
        return f"ranks {err.unfinished} did not finish within the launch timeout"
    text = err.summary.split(" failed: ", 1)[-1]
    if "killed by" in text:
        return text[text.index("killed by"):].split(":")[0].rstrip(")")
    low = err.remote_traceback.lower()
    if "timed out" in low or "timeout" in low:
        return f"collective timeout ({text[:120]})"
    return text[:160]


def run(launch_once, save: str, load, max_restarts: int, recorder: Recorder, log=None) -> tuple:
    """Call ``launch_once(load)`` until it returns; after a RankFailed / LaunchTimeout relaunch with
    ``load=save`` (at most ``max_restarts`` times). Returns (outputs, events, attempt walls)."""
    from .checkpoint import files
    from .launch_collect import LaunchTimeout, RankFailed
    log = log or (lambda line: print(line, file=sys.stderr, flush=True))
    events, walls = [], []
    while True:
        t0 = time.time()
        try:
            outs = launch_once(load)
            walls.append({"attempt": recorder.attempt, "start": t0, "end": time.time(), "failed": False})
            return outs, events, walls
        except (RankFailed, LaunchTimeout) as err:
            t1 = time.time()
            walls.append({"attempt": recorder.attempt, "start": t0, "end": t1, "failed": True})
            if recorder.attempt >= max_restarts:
                raise
            found = files.find(save)
            resume_at = 0 if found is None else int(found.name.split("_")[-1])
            reached = recorder.reached()
            event = {"attempt": recorder.attempt, "rank": getattr(err, "rank", None), "why": why(err),
                     "reached": reached, "resumed_from": resume_at, "lost_iterations": max(0, reached - resume_at),
                     "detected_s": t1 - t0}
            events.append(event)
            log(f"labkit.train: rank {event['rank']} failed ({event['why']}) after iteration {reached}; "
                f"restart {recorder.attempt + 1}/{max_restarts} from the checkpoint at iteration {resume_at} "
                f"({event['lost_iterations']} iteration(s) to recompute)")
            recorder.attempt += 1
            load = save


def account(recorder: Recorder, walls: list[dict], events: list[dict]) -> dict:
    """Goodput and its losses by cause, in seconds (module docstring). ``goodput`` = useful / wall;
    ``goodput_after_startup`` leaves out the first start-up, which a run without failures pays too."""
    wall = walls[-1]["end"] - walls[0]["start"]
    kept = sorted(recorder.iterations.values(), key=lambda m: m["labkit.iteration"])
    useful = sum(m["s"] for m in kept)
    recomputed = sum(m["s"] for m in recorder.recomputed)
    saves = sum(s["blocking_s"] for s in recorder.saves)
    first = [m["t0"] for m in kept + recorder.recomputed if m["attempt"] == 0]
    startup = (min(first) if first else walls[0]["end"]) - walls[0]["start"]
    restart = wall - useful - recomputed - saves - startup
    steps = len(kept)
    return {"wall_s": wall, "useful_s": useful, "recomputed_s": recomputed, "save_blocking_s": saves,
            "startup_s": startup, "restart_s": restart, "restarts": len(events),
            "recomputed_iterations": len(recorder.recomputed), "iterations": steps,
            "saves": len(recorder.saves), "goodput": useful / wall if wall > 0 else 0.0,
            "goodput_after_startup": useful / (wall - startup) if wall > startup else 0.0,
            "step_s": useful / steps if steps else 0.0,
            "save_s": saves / len(recorder.saves) if recorder.saves else 0.0,
            "restart_each_s": restart / len(events) if events else 0.0,
            "recomputed_losses_equal": not recorder.mismatch}


def predicted(measured: dict, save_interval: int) -> dict:
    """``labkit.calc.goodput`` for the run's own numbers: the interval (save_interval x the mean
    step), the mean save blocking, the mean cost of a restart, and the MTBF (wall after start-up
    over the failures). {"goodput", "mtbf_s", "interval_s", "young_s", "daly_s"}."""
    from .calc import goodput as gp
    n = measured["restarts"]
    tau = save_interval * measured["step_s"]
    mtbf = (measured["wall_s"] - measured["startup_s"]) / n if n else float("inf")
    if not n:
        g = tau / (tau + measured["save_s"])
        return {"goodput": g, "mtbf_s": mtbf, "interval_s": tau, "young_s": None, "daly_s": None}
    block = measured["save_s"]
    return {"goodput": gp.goodput(tau, block, mtbf, measured["restart_each_s"]), "mtbf_s": mtbf,
            "interval_s": tau, "young_s": gp.young_interval(block, mtbf) if block > 0 else None,
            "daly_s": gp.daly_interval(block, mtbf) if block > 0 else None}


def saved_state(save) -> dict:
    """{key: value} of the latest finished checkpoint in ``save``, every tensor whole (DCP's
    reassembly, independent of the layout that wrote it): weights, optimizer states, step, RNG."""
    import tempfile

    import torch
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    from .checkpoint import files
    found = files.verify(files.find(save))
    with tempfile.TemporaryDirectory() as tmp:
        dcp_to_torch_save(str(found.path), f"{tmp}/state.pt")
        return torch.load(f"{tmp}/state.pt", weights_only=False)


def same_state(a: dict, b: dict) -> list[str]:
    """Keys whose values differ (torch.equal for tensors, == otherwise); [] when bit-identical."""
    import torch
    diff = sorted(set(a) ^ set(b))
    for k in sorted(set(a) & set(b)):
        x, y = a[k], b[k]
        same = torch.equal(x, y) if torch.is_tensor(x) and torch.is_tensor(y) else _equal(x, y)
        if not same:
            diff.append(k)
    return diff


def _equal(x, y) -> bool:
    import torch
    if isinstance(x, dict) and isinstance(y, dict):
        return x.keys() == y.keys() and all(_equal(x[k], y[k]) for k in x)
    if isinstance(x, (list, tuple)) and isinstance(y, (list, tuple)):
        return len(x) == len(y) and all(_equal(u, v) for u, v in zip(x, y))
    if torch.is_tensor(x) and torch.is_tensor(y):
        return torch.equal(x, y)
    return x == y

"""Check for the lab "When training goes wrong": resume after a kill, bit for bit.

``resume-after-kill``: the student writes ``save_checkpoint(path, iteration, model, optimizer,
data_gen)`` and ``load_checkpoint(path, model, optimizer, data_gen) -> iteration`` for a small
training loop of this module's (:func:`train_loop`: an MLP with dropout, AdamW, batches drawn from
a ``torch.Generator``). ``produce`` runs the loop in a process of its own (``labkit.launch``, one
gloo rank) with a checkpoint every ``save_interval`` iterations and **kills it with SIGKILL**
before iteration ``kill_at``; a fresh process then calls the student's ``load_checkpoint`` and
trains to the end. What comes back: the iteration it resumed at, the state right after the load
(weights, both AdamW moments, the step, the two RNG states), and the losses and final state.

``judge`` never runs the student's code: it trains the same loop in this process without ever
stopping (:func:`train_loop`, the reference) and compares, ``torch.equal`` throughout; a failure
names the first thing the checkpoint did not bring back (the iteration, the weights, the moments,
the step, the dropout RNG, the data generator), in that order. Visible case: kill before iteration
5 with a checkpoint every 3; hidden: other intervals, kill points and seeds (``solutions/hidden/``).
"""
from __future__ import annotations

import os
import tempfile

from . import report
from .hints import asker
from .spec import Spec, failed, failure, ranks

OWN = ("labkit.checkpoint.saver:Saver", "labkit.checkpoint.saver:load_into")
PARTS = ("weights", "exp_avg", "exp_avg_sq", "step", "dropout_rng", "data_rng")
WHAT = {"weights": "the weights (model.state_dict())",
        "exp_avg": "AdamW's first moments (optimizer.state_dict())",
        "exp_avg_sq": "AdamW's second moments (optimizer.state_dict())",
        "step": "AdamW's step count (its bias correction depends on it; optimizer.state_dict())",
        "dropout_rng": "the dropout masks' random stream (torch.get_rng_state())",
        "data_rng": "the data sampler's position (data_gen.get_state())"}


def build(seed: int):
    """(model, optimizer, data generator) of the exercise's run, seeded."""
    import torch
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Dropout(0.25),
                                torch.nn.Linear(16, 1)).double()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.01)
    return model, optimizer, torch.Generator().manual_seed(1000 + seed)


def snapshot(model, optimizer, data_gen) -> dict:
    """Everything a bit-identical resume needs, as tensors: {part: tensor}."""
    import torch
    params = list(model.parameters())
    state = [optimizer.state.get(p, {}) for p in params]

    def flat(key):
        return torch.cat([s[key].reshape(-1) if key in s else torch.zeros(p.numel(), dtype=p.dtype)
                          for s, p in zip(state, params)])
    step = state[0].get("step", 0) if state else 0
    return {"weights": torch.cat([p.detach().reshape(-1) for p in params]).clone(), "exp_avg": flat("exp_avg"),
            "exp_avg_sq": flat("exp_avg_sq"), "step": torch.tensor(float(step)),
            "dropout_rng": torch.get_rng_state().clone(), "data_rng": data_gen.get_state().clone()}


def step(model, optimizer, data_gen) -> float:
    """One iteration: a batch from ``data_gen``, dropout from torch's default generator, AdamW."""
    import torch
    x = torch.randn(4, 8, generator=data_gen, dtype=torch.float64)
    y = x.sum(dim=1, keepdim=True).sin()
    loss = torch.nn.functional.mse_loss(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss.item()


def train_loop(steps: int, seed: int, stop_at: int | None = None) -> dict:
    """The reference: ``steps`` iterations without a stop; with ``stop_at`` also the snapshot
    after that many iterations. {"losses", "final", "at"}."""
    model, optimizer, data_gen = build(seed)
    losses, at = [], None
    for it in range(steps):
        if it == stop_at:
            at = snapshot(model, optimizer, data_gen)
        losses.append(step(model, optimizer, data_gen))
    return {"losses": losses, "final": snapshot(model, optimizer, data_gen), "at": at}


def _rank(student, folder: str, steps: int, save_interval: int, kill_at, seed: int) -> dict:
    """In a process of its own: (load,) train, save every ``save_interval``, SIGKILL at ``kill_at``."""
    import signal
    fns = student.load()
    model, optimizer, data_gen = build(seed)
    path = os.path.join(folder, "checkpoint.pt")
    start, after_load = 0, None
    if os.path.exists(path):
        start = fns["load"](path, model, optimizer, data_gen)
        after_load = snapshot(model, optimizer, data_gen)
    losses = []
    for it in range(int(start) if isinstance(start, int) else 0, steps):
        if it == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)       # no goodbye: whatever is not on disk is gone
        losses.append(step(model, optimizer, data_gen))
        if (it + 1) % save_interval == 0:
            fns["save"](path, it + 1, model, optimizer, data_gen)
    return {"start": start if isinstance(start, int) and not isinstance(start, bool) else repr(start)[:80],
            "after_load": after_load, "losses": losses, "final": snapshot(model, optimizer, data_gen)}


def _produce(student, steps=8, save_interval=3, kill_at=5, seed=0):
    with tempfile.TemporaryDirectory() as folder:
        _, fail = ranks(_rank, 1, student, folder, steps, save_interval, kill_at, seed, timeout=120)
        if fail is None or fail.get("signal") != 9:
            return fail or failure("invalid", f"the run was not killed before iteration {kill_at}")
        if not os.path.exists(os.path.join(folder, "checkpoint.pt")):
            return failure("invalid", f"no file at path after the save at iteration {save_interval}: "
                                      "save_checkpoint must write the checkpoint to path")
        out, fail = ranks(_rank, 1, student, folder, steps, save_interval, None, seed, timeout=120)
    return fail if fail is not None else out[0]


def _judge(data, steps=8, save_interval=3, kill_at=5, seed=0):
    import torch
    name = f"resume_after_kill (kill before iteration {kill_at}, a checkpoint every {save_interval})"
    bad = failed(name, data, "save_checkpoint(path, iteration, model, optimizer, data_gen) writes a file; "
                             "load_checkpoint(path, model, optimizer, data_gen) reads it and returns the iteration")
    if bad is not None:
        return bad
    if type(data) is not dict or not {"start", "after_load", "losses", "final"} <= set(data):
        return report(name, False, "the run returned no result the check can read")
    last = (kill_at // save_interval) * save_interval
    if type(data["start"]) is not int or data["start"] != last:
        return report(name, False, f"load_checkpoint returned {data['start']!r}; the last checkpoint before the "
                      f"kill was written after iteration {last}", "save the iteration with the state and return it")
    ref = train_loop(steps, seed, stop_at=last)
    for part in PARTS:
        got = (data["after_load"] or {}).get(part)
        if not (isinstance(got, torch.Tensor) and torch.equal(got, ref["at"][part])):
            return report(name, False, f"after load_checkpoint, {WHAT[part]} is not what the run had at iteration "
                          f"{last}", f"put {WHAT[part].split(' (')[0]} in the checkpoint, and back in load_checkpoint")
    losses = data["losses"]
    if type(losses) is not list or any(type(x) is not float for x in losses) or losses != ref["losses"][last:]:
        return report(name, False, "the state after the load is right but the losses after it differ",
                      "load_checkpoint must not change anything after restoring it")
    final = data["final"] if type(data["final"]) is dict else {}
    if any(not (isinstance(final.get(p), torch.Tensor) and torch.equal(final[p], ref["final"][p])) for p in PARTS):
        return report(name, False, "the losses agree but the final state differs")
    return report(name, True, f"killed by SIGKILL before iteration {kill_at}, resumed at {last}: losses, weights, "
                              f"both moments, the step and both RNG streams bit-identical to the run that never stopped")


RESUME = Spec("resume-after-kill", {"save": "save_checkpoint", "load": "load_checkpoint"}, _produce, _judge,
              cases=({"steps": 8, "save_interval": 3, "kill_at": 5, "seed": 0},), forbid=OWN, ranks=True,
              per_rank=False, why="write the checkpoint yourself with torch.save and torch.load", hints=(
                  "a checkpoint is a dict you torch.save: the iteration, model.state_dict(), "
                  "optimizer.state_dict() ... and what else draws random numbers?",
                  "two random streams: dropout draws from torch's default generator (torch.get_rng_state()), "
                  "the batches from data_gen (data_gen.get_state())",
                  "restore each with its setter: model.load_state_dict, optimizer.load_state_dict, "
                  "torch.set_rng_state, data_gen.set_state; return the saved iteration"))


def resume_after_kill(save_checkpoint, load_checkpoint, steps=8, save_interval=3, kill_at=5, seed=0):
    """Kill a run that checkpoints with the student's functions, resume it; prints one [check] line."""
    from .spec import run
    return run(RESUME, {"save": save_checkpoint, "load": load_checkpoint}, steps=steps,
               save_interval=save_interval, kill_at=kill_at, seed=seed)


SPECS = {RESUME.id: RESUME}
hint = asker(SPECS)

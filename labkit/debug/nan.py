"""NaN, Inf and loss spikes: Megatron-LM's checks, found on the rank where they appear.

Chapter "When training goes wrong". Megatron checks, by default (``--no-check-for-nan-in-loss-and-grad``
turns it off; d98e8a64):

* every microbatch's loss on the last stage, before the data-parallel all-reduce of the losses
  ("found NaN in local forward loss calculation", ``pretrain_gpt.py`` ``loss_func``);
* every gradient bucket's norm before the data-parallel reduction ("found NaN in local grad norm
  for bucket #i in backward pass before data-parallel communication collective",
  ``megatron/core/distributed/param_and_grad_buffer.py`` ``check_grads``);
* with ``--check-for-spiky-loss``, a loss above 10x the largest seen so far (``SPIKY_LOSS_FACTOR``),
  not fatal (Megatron reruns the iteration to tell a hardware fault from a real spike).

Checked locally, BEFORE the collective, so the error names the rank that made the NaN: after an
all-reduce every rank holds it. ``labkit.train(probe=check_nan())``; :func:`plant_nan` puts a NaN
in one rank's gradient, :func:`chain` runs several probes.
"""
from __future__ import annotations

import math

SPIKY_LOSS_FACTOR = 10     # Megatron's pretrain_gpt.py


class chain:  # noqa: N801 - used like a function: probe=chain(plant_nan(...), check_nan())
    """Several probe makers as one: each is made, begun and ended in order."""

    def __init__(self, *makers):
        self.makers = makers

    def __call__(self, *args):
        self.probes = [m(*args) for m in self.makers]
        return self

    def begin(self, iteration: int) -> None:
        for p in self.probes:
            p.begin(iteration)

    def end(self) -> list:
        return [p.end() for p in self.probes]


class check_nan:  # noqa: N801
    """Megatron's --check-for-nan-in-loss-and-grad (and --check-for-spiky-loss) on every rank."""

    def __init__(self, spiky_loss: bool = True):
        self.spiky_loss = spiky_loss

    def __call__(self, engine, topo, groups, cfg):
        import torch.distributed as dist
        self.engine, self.it, self.rank = engine, 0, dist.get_rank()
        c = engine.coords
        self.who = f"Rank {self.rank} (pp {c['pp']}, tp {c['tp']}, cp {c['cp']}, dp {c['dp']})"
        self.spikes, self.largest = [], 0.0
        loss_fn = engine.runner.chunks[-1].loss_fn
        if loss_fn is not None:                     # the last stage: every microbatch's loss
            loss_fn.register_forward_hook(lambda m, args, out: self._loss(float(out)))
        for i, member in enumerate(engine.dp.members):
            finish = member.finish_grad_sync

            def checked(member=member, finish=finish, i=i):
                self._grads(member, i)
                finish()
            member.finish_grad_sync = checked
        return self

    def _loss(self, value: float) -> None:
        for bad, word in ((math.isnan, "NaN"), (math.isinf, "Inf")):
            if bad(value):
                raise RuntimeError(f"{self.who}: found {word} in local forward loss calculation "
                                   f"(iteration {self.it + 1})")
        if self.spiky_loss and self.largest and value > SPIKY_LOSS_FACTOR * self.largest:
            self.spikes.append({"iteration": self.it + 1, "loss": value, "largest before": self.largest})
        self.largest = max(self.largest, value)

    def _grads(self, member, i: int) -> None:
        import torch
        sq = torch.zeros((), dtype=torch.float64)
        for p in member.params:
            if p.grad is not None:
                sq += p.grad.detach().double().pow(2).sum().cpu()
        norm = float(sq) ** 0.5
        for bad, word in ((math.isnan, "NaN"), (math.isinf, "Inf")):
            if bad(norm):
                raise RuntimeError(f"{self.who}: found {word} in local grad norm for bucket #{i} in backward "
                                   f"pass before data-parallel communication collective (iteration {self.it + 1})")

    def begin(self, iteration: int) -> None:
        self.it = iteration

    def end(self) -> dict:
        return {"spikes": self.spikes}


class plant_nan:  # noqa: N801
    """On rank ``rank``, at iteration ``iteration`` (from 1), make one parameter's gradient NaN
    (``what="grad"``) or multiply the loss of one microbatch by ``spike`` (``what="spike"``)."""

    def __init__(self, rank: int, iteration: int, what: str = "grad", spike: float = 100.0):
        if what not in ("grad", "spike"):
            raise ValueError(f"what must be 'grad' or 'spike', got {what!r}")
        self.rank, self.iteration, self.what, self.spike = rank, iteration, what, spike

    def __call__(self, engine, topo, groups, cfg):
        import torch.distributed as dist
        self.armed, self.mine = False, dist.get_rank() == self.rank
        chunk = engine.runner.chunks[-1]
        if self.mine and self.what == "grad":
            p = next(chunk.parameters())
            p.register_hook(lambda g: g * float("nan") if self.armed else g)
        if self.mine and self.what == "spike" and chunk.loss_fn is not None:
            chunk.loss_fn.register_forward_hook(lambda m, a, out: out * self.spike if self.armed else out)
        return self

    def begin(self, iteration: int) -> None:
        self.armed = self.mine and iteration + 1 == self.iteration

    def end(self):
        return None

"""Small probes to attach to a run: a gradient log for the reference, a save killed halfway.

    ref = train_reference(steps=5, probe=GradHistory, **kw)   # ref["probe"][i]: grads of iteration i+1
    labkit.train(..., save=DIR, save_interval=2, probe=crash_during_save(4, rank=1))
"""
from __future__ import annotations

import os


class GradHistory:
    """Reference side (``train_reference(probe=GradHistory)``): every parameter's gradient after each iteration, by
    dense name. Read at the start of the next iteration (before ``zero_grad``) and at the end."""

    def __init__(self, model):
        self.model, self.grads = model, []

    def _take(self) -> None:
        self.grads.append({n: p.grad.detach().clone() for n, p in self.model.named_parameters()
                           if p.grad is not None})

    def begin(self, iteration: int) -> None:
        if iteration > 0:
            self._take()

    def end(self) -> list[dict]:
        self._take()
        return self.grads


class crash_during_save:  # noqa: N801 - used like a function: probe=crash_during_save(4, rank=1)
    """Kill rank ``rank`` halfway through writing the checkpoint of ``iteration``: it writes half of
    its pieces, then exits (code 17) as a machine failure would. The previous checkpoint must
    still load (labkit/checkpoint/files.py)."""

    def __init__(self, iteration: int, rank: int = 0):
        self.iteration, self.rank = iteration, rank

    def __call__(self, engine, topo, groups, cfg):
        import torch.distributed as dist
        self.me = dist.get_rank()
        return self

    def begin(self, iteration: int) -> None:
        if self.me != self.rank or iteration != self.iteration - 1:
            return
        import dataclasses

        from torch.distributed.checkpoint import FileSystemWriter
        original = FileSystemWriter.write_data

        def write_half(writer, plan, planner):
            half = dataclasses.replace(plan, items=plan.items[:max(1, len(plan.items) // 2)])
            original(writer, half, planner).wait()
            os._exit(17)
        FileSystemWriter.write_data = write_half

    def end(self):
        return None

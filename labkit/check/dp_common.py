"""What the Data-parallelism lab's checks share: the model, the batches, one device's training."""
from __future__ import annotations

import functools

from . import describe_mismatch, report

STEPS, GBS, TOL = 3, 8, 1e-10  # float64: only the order of additions differs
MODEL = dict(num_layers=1, hidden_size=32, num_attention_heads=4, seq_length=16, params_dtype="float64")


def _setup(mbs: int, seed: int = 0):
    import torch

    from .. import data
    from ..config import TrainConfig
    from ..groups import world_group
    from ..model import GPT
    cfg = TrainConfig(micro_batch_size=mbs, global_batch_size=GBS, **MODEL)
    model = GPT(cfg.model_config(), seed=seed).to(torch.float64)
    return cfg, model, world_group(), data


def _microbatches(data, group, it, mbs, seed: int = 0):
    x, y = data.get_batch(data.load_tokens(), it, GBS, MODEL["seq_length"], seed)
    return data.microbatches(x, y, mbs, group.size, group.rank)


def _world() -> int:
    import torch.distributed as dist
    return dist.get_world_size()


@functools.lru_cache(maxsize=4)
def reference(seed: int = 0):
    """Single-device: parameters after each step and the gradient of step 1 (float64), in the
    judge's process. Cached: the three DP checks of the lab share it."""
    from .. import data
    from ..reference import train_reference
    kw = dict(micro_batch_size=GBS, global_batch_size=GBS, seed=seed, **MODEL)
    params = [{n: p.detach() for n, p in train_reference(steps=k, return_model=True, **kw)["model"].named_parameters()}
              for k in range(1, STEPS + 1)]
    model = train_reference(steps=0, return_model=True, **kw)["model"]
    x, y = data.get_batch(data.load_tokens(), 0, GBS, MODEL["seq_length"], seed)
    model.loss(x, y).backward()
    return params, {n: p.grad for n, p in model.named_parameters()}


def compare_params(title, results, ref_params, hint: str):
    """The first parameter that differs from one device's after some step, reported; or None."""
    for r, out in enumerate(results):
        for k, expected in enumerate(ref_params):
            for n, e in expected.items():
                problem = describe_mismatch(out["params"][k][n], e, TOL, TOL, f"rank {r}, step {k + 1}, {n} ")
                if problem:
                    return report(title, False, problem, hint)
    return None

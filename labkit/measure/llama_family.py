"""The Llama family under every axis, measured (chapter "The Llama family under every axis").

* :func:`parity` - ``labkit.train`` of a family on a layout against ``labkit.reference`` (float64):
  losses, and the largest loss and gradient differences;
* :func:`trap_worker` / :func:`traps` - the tiny Llama cut over tp ranks with SP as the TP plan
  cuts it, gradients finished from the shard plan, compared with the dense model; and the same
  with one of version 2's traps put back (an RMSNorm that is not a "norm" to the plan, so its
  gradient is not summed; SwiGLU's fc1 cut contiguously). Used by tests/test_llama.py too.
"""
from __future__ import annotations

TRAPS = ("plan", "norm not a role", "fc1 contiguous")


def parity(world_size: int, steps: int = 3, family: str = "llama3-tiny", seed: int = 0, **layout) -> dict:
    """{"losses", "reference", "max_loss_diff", "max_grad_diff"} of ``family`` (a preset of
    ``labkit.spec``) trained on ``layout`` (TrainConfig overrides), float64, micro batch 2, global 8."""
    from ..reference import train_reference
    from ..spec import preset_args
    from ..training import train
    kw = dict(preset_args(family), params_dtype="float64", micro_batch_size=2, global_batch_size=8)
    kw.update(layout)
    res = train(world_size=world_size, steps=steps, seed=seed, log_interval=0, capture_grads=True, **kw)
    ref = train_reference(world_size=world_size, steps=steps, seed=seed, capture_grads=True, **kw)
    return {"losses": res.losses, "reference": ref["losses"],
            "max_loss_diff": max(abs(a - b) for a, b in zip(res.losses, ref["losses"])),
            "max_grad_diff": max(float((res.grads[n] - g).abs().max()) for n, g in ref["grads"].items())}


def trap_worker(mode: str) -> float:
    """On each of the tp ranks (the whole world): cut the dense tiny Llama with SP, finish the
    gradients from the shard plan (the "tp" sums, as the Engine), and return the largest difference
    to the dense model's gradients, each rank's slice of them. ``mode``: one of :data:`TRAPS`."""
    import copy

    import torch

    from .. import comm, shard_plan
    from ..groups import world_group
    from ..model import GPT, preset
    from ..tensor_parallel import plan as tp

    group = world_group()
    dense = GPT(preset("llama3-tiny", vocab_size=512), seed=3).double()
    styles = tp.tp_plan(sequence_parallel=True)
    if mode == "norm not a role":            # v2's SP tags found norms by class (nn.LayerNorm only)
        del styles["norm"]
    elif mode == "fc1 contiguous":           # [gate; up] cut into contiguous halves
        shard_plan.stacked = lambda n, stack, parts, index: shard_plan.contiguous(n, parts, index)
    elif mode != "plan":
        raise ValueError(f"mode must be one of {TRAPS}, got {mode!r}")
    cut = copy.deepcopy(dense)
    plan = shard_plan.initial(cut)
    tp.apply_plan(cut, styles, group, plan)
    gen = torch.Generator().manual_seed(1)
    tokens, labels = (torch.randint(0, 256, (2, 16), generator=gen) for _ in range(2))
    dense.loss(tokens, labels).backward()
    cut.loss(tokens, labels).backward()
    for name, p in cut.named_parameters():     # what the Engine does after the backward
        flat = p.grad.view(-1)
        for lo, hi in plan[name].sum_ranges("tp"):
            flat[lo:hi].copy_(comm.all_reduce(group, flat[lo:hi]))
    grads = dict(dense.named_parameters())
    return max(float((p.grad - shard_plan.cut(grads[plan[n].name].grad, plan[n])).abs().max())
               for n, p in cut.named_parameters())


def traps(tp: int = 2) -> dict[str, float]:
    """{mode: largest gradient difference over the tp ranks} for every mode of :data:`TRAPS`."""
    from ..launcher import launch
    return {mode: max(launch(trap_worker, tp, mode, timeout=120.0)) for mode in TRAPS}


def _plan_worker(layout: dict, family: str, prefix: str) -> list[dict]:
    from ..config import TrainConfig
    from ..spec import preset_args
    from ..training import build_rank
    cfg = TrainConfig(**dict(preset_args(family), params_dtype="float64", micro_batch_size=2,
                             global_batch_size=8, **layout))
    _, _, engine = build_rank(cfg)
    return [row for row in engine.plan.describe() if row["parameter"].startswith(prefix)]


def shard_plan_rows(world_size: int, rank: int, family: str = "llama3-tiny",
                    prefix: str = "decoder.layers.0.", **layout) -> list[dict]:
    """The shard plan of ``rank`` under ``layout``, as rows (``ShardPlan.describe``), for the
    parameters whose name starts with ``prefix``: what the engine reads, shown as a table."""
    from ..launcher import launch
    return launch(_plan_worker, world_size, layout, family, prefix, timeout=120.0)[rank]


QK_TRAPS = ("plan", "qk_norm as a norm", "qk_norm left replicated")


def _qk_batch():
    import torch
    gen = torch.Generator().manual_seed(1)
    return [torch.randint(0, 256, (2, 16), generator=gen) for _ in range(2)]


def qk_trap_worker(mode: str, sequence_parallel: bool, native: bool) -> float:
    """On each tp rank: the tiny Llama with QK-layernorm (Megatron's --qk-layernorm), cut by labkit's
    TP plan (``native`` False: gradients finished from the shard plan, as the Engine) or by the
    DTensor plan (True), against the dense model: the largest gradient difference, this rank's
    slice. ``mode`` "qk_norm as a norm" plants the trap of the last review (the per-head norm
    under the role "norm": summed over tp only under SP); "qk_norm left replicated" gives it no
    native style (the native plan of v3 left unknown roles so)."""
    from dataclasses import replace

    from .. import roles
    if mode not in QK_TRAPS:
        raise ValueError(f"mode must be one of {QK_TRAPS}, got {mode!r}")
    row = roles.ROLES["qk_norm"]
    if mode == "qk_norm as a norm":
        roles.ROLES["qk_norm"] = replace(roles.ROLES["norm"], name="qk_norm", recompute=None)
    elif mode == "qk_norm left replicated":
        roles.ROLES["qk_norm"] = replace(row, native="seam")
    try:
        return _qk_diff(sequence_parallel, native)
    finally:
        roles.ROLES["qk_norm"] = row


def _qk_diff(sequence_parallel: bool, native: bool) -> float:
    import copy

    import torch

    from .. import comm, shard_plan
    from ..groups import world_group
    from ..model import GPT, preset
    dense = GPT(preset("llama3-tiny", qk_layernorm=True), seed=3).double()
    cut = copy.deepcopy(dense)
    tokens, labels = _qk_batch()
    dense.loss(tokens, labels).backward()
    want = dict(dense.named_parameters())
    group = world_group()
    if native:
        from torch.distributed.device_mesh import init_device_mesh

        from ..native.tp_plan import apply_tensor_parallel, dense_grad
        apply_tensor_parallel(cut, init_device_mesh("cpu", (group.size,)), sequence_parallel)
        cut.loss(tokens, labels).backward()
        full = {n: p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
                for n, p in cut.named_parameters()}
        return max(float((dense_grad(cut, n, g) - want[n].grad).abs().max()) for n, g in full.items())
    from ..tensor_parallel import plan as tp
    plan = shard_plan.initial(cut)
    tp.apply_plan(cut, tp.tp_plan(sequence_parallel), group, plan)
    cut.loss(tokens, labels).backward()
    for name, p in cut.named_parameters():     # what the Engine does after the backward
        flat = p.grad.view(-1)
        for lo, hi in plan[name].sum_ranges("tp"):
            flat[lo:hi].copy_(comm.all_reduce(group, flat[lo:hi]))
    return max(float((p.grad - shard_plan.cut(want[plan[n].name].grad, plan[n])).abs().max())
               for n, p in cut.named_parameters())


QK_CASES = [(mode, sp, native) for native in (False, True) for mode in QK_TRAPS for sp in (False, True)
            if mode != ("qk_norm left replicated" if not native else "qk_norm as a norm")]


def _qk_all(cases) -> list[float]:
    return [qk_trap_worker(*case) for case in cases]


def qk_traps(tp: int = 2) -> dict:
    """{(mode, sequence_parallel, native): largest gradient difference over the tp ranks}, every
    case of :data:`QK_CASES` in one launch."""
    from ..launcher import launch
    per_rank = launch(_qk_all, tp, QK_CASES, timeout=180.0)
    return {case: max(r[i] for r in per_rank) for i, case in enumerate(QK_CASES)}

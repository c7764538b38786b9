"""One training run through PyTorch's own APIs, on every rank: what ``labkit.train(...,
implementation="native")`` launches (chapter "From labkit to PyTorch-native").

The order is torchtitan's ``parallelize_llama`` and labkit's ``parallelize`` alike:

    1. PP    keep this rank's stages: ``GPT.part`` per stage index (pipeline.py)
    2. TP    ``parallelize_module`` with the plan of tp_plan.py on each stage, over mesh["tp"]
    3. DP    ``fully_shard`` per layer, then the stage (fsdp.py), over mesh["dp"] (HSDP: 2-d)
    4. run   a pipelining schedule over the stages, or a plain loop over the microbatches

Each iteration is the same global batch as ``labkit.train`` and ``labkit.reference`` (labkit/data.py)
cut the same way (microbatch j of dp rank r), then one AdamW step over what the rank holds. The
forward-backward runs under ``CommDebugMode`` and :class:`~labkit.native.count.ByteCounter`, so
every collective of the step is counted (calls, and bytes per axis). A ``CommDebugMode`` serves one
microbatch only: its module tracker pops a parent it never pushed on the second forward (an
IndexError in ``_fw_set_module_hook``, torch 2.13), so each microbatch, and the gradient finish,
runs under a fresh one (:func:`_comm_debug`) and the counts are summed.
"""
from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist

from .options import NativeOptions, schedule_of


def local_microbatches(cfg, topo, dp_rank: int, iteration: int, seed: int, tokens, num_samples):
    """This dp rank's microbatches of iteration ``iteration`` (``labkit.training.rank_microbatches``'s
    rule: Megatron's sampler order over the layout-independent global batch)."""
    from .. import data
    gbs = cfg.global_batch(topo)
    if cfg.data_path is None:
        inputs, labels = data.get_batch(tokens, iteration, gbs, cfg.seq_length, seed)
    else:
        from ..indexed_dataset import get_batch
        inputs, labels = get_batch(cfg.data_path, iteration, gbs, cfg.seq_length, seed, num_samples)
    return data.microbatches(inputs, labels, cfg.micro_batch_size, topo.dp, dp_rank)


def build(cfg, topo, opts: NativeOptions, seed: int = 0):
    """(mesh, parts, stages, schedule) on this rank: the model built from ``seed`` and cut in the
    fixed order. ``parts``: the modules this rank holds (one per stage, or the whole GPT)."""
    from ..model import GPT
    from .fsdp import apply_data_parallel
    from .mesh import build_mesh
    from .pipeline import build_schedule, build_stages, stages_per_rank
    from .tp_plan import apply_tensor_parallel

    mesh = build_mesh(topo, opts.dp_replicate)
    model = GPT(cfg.model_config(), seed=seed).to(dtype=getattr(torch, cfg.params_dtype))
    sched_name, stages, sched = schedule_of(cfg, opts), None, None
    if sched_name is not None:                                               # 1. PP
        v = stages_per_rank(sched_name, cfg.num_layers, topo.pp, cfg.num_layers_per_virtual_pipeline_stage)
        stages = build_stages(model, mesh.get_group("pp"), sched_name, v, torch.device("cpu"))
        parts = [st.submod for st in stages]
    else:
        parts = [model]
    for part in parts:
        if topo.tp > 1:                                                      # 2. TP (+SP)
            apply_tensor_parallel(part, mesh["tp"], cfg.sequence_parallel, opts.loss_parallel)
        if topo.dp > 1 or opts.mixed_precision:                              # 3. DP / FSDP2
            apply_data_parallel(part, mesh, cfg.effective_zero_stage, opts.mixed_precision)
    if stages is not None:
        sched = build_schedule(sched_name, stages, cfg.num_microbatches(topo))
    return mesh, parts, stages, sched


def forward_backward(cfg, topo, parts, stages, sched, microbatches, opts: NativeOptions, calls=None):
    """One iteration's forward and backward on this rank; returns the mean loss over its
    microbatches on a rank that computes the loss, else None. ``calls``: a dict that gathers
    ``CommDebugMode``'s counts, one fresh mode per microbatch (no pipeline only)."""
    from torch.distributed.tensor.parallel import loss_parallel

    from .grads import finish_partial_grads
    from .pipeline import run_step
    lp = loss_parallel() if topo.tp > 1 and opts.loss_parallel else contextlib.nullcontext()
    with lp:
        if sched is not None:                       # the schedule splits the local batch again
            tokens = torch.cat([x for x, _ in microbatches])
            labels = torch.cat([y for _, y in microbatches])
            loss = run_step(sched, stages, tokens, labels)
        else:
            loss = _loop(parts[0], microbatches, calls)
    with _comm_debug(calls):
        finish_partial_grads([p for part in parts for p in part.parameters()])
    return loss


@contextlib.contextmanager
def _comm_debug(calls):
    """A fresh ``CommDebugMode`` whose counts are added to ``calls`` (nothing when None)."""
    if calls is None:
        yield
        return
    from torch.distributed.tensor.debug import CommDebugMode

    from .count import comm_debug_counts
    mode = CommDebugMode()
    with mode:
        yield
    for op, n in comm_debug_counts(mode).items():
        calls[op] = calls.get(op, 0) + n


def _loop(model, microbatches, calls=None) -> float:
    """No pipeline: each microbatch forward and backward, loss / m (gradient accumulation)."""
    from torch.distributed.tensor import DTensor
    m, total = len(microbatches), 0.0
    for j, (x, y) in enumerate(microbatches):
        if hasattr(model, "set_requires_gradient_sync"):
            model.set_requires_gradient_sync(j == m - 1)   # reduce once, after the last
        with _comm_debug(calls):
            loss = model(x, y) / m                         # a DTensor under loss parallel
            loss.backward()
        loss = loss.detach()
        total += float(loss.full_tensor() if isinstance(loss, DTensor) else loss)
    return total


def worker(cfg, steps: int, seed: int, log_interval: int, capture_grads: bool,
           opts: NativeOptions, log_line=None) -> dict:
    """Runs on every rank (``labkit.launch``): build, cut, train; the same return value as
    ``labkit.training._worker``. ``log_line``: formats rank 0's Megatron-style line per iteration."""
    from .. import data
    from ..launcher import now, send_to_parent
    from .count import ByteCounter
    from .grads import clip_, full_grads, grad_norm
    from .mesh import axis_groups

    topo = cfg.topology(dist.get_world_size())   # validated once by the caller (check_native)
    rank = dist.get_rank()
    coords = topo.coords(rank)
    mesh, parts, stages, sched = build(cfg, topo, opts, seed)
    params = [p for part in parts for p in part.parameters()]
    opt = torch.optim.AdamW(params, lr=cfg.lr, betas=(cfg.adam_beta1, cfg.adam_beta2),
                            eps=cfg.adam_eps, weight_decay=cfg.weight_decay)
    counter, calls = ByteCounter(axis_groups(mesh)), {}
    tokens = data.load_tokens() if cfg.data_path is None else None
    gbs = cfg.global_batch(topo)
    losses, norms, times, grads, per_step = [], [], [], None, []
    for it in range(steps):
        t0 = now()
        mbs = local_microbatches(cfg, topo, coords["dp"], it, seed, tokens, steps * gbs)
        opt.zero_grad(set_to_none=True)
        counter.log.clear()                         # this step's collectives, in order
        # CommDebugMode cannot wrap a pipelining step (options.COMMDEBUG_PP_ERROR): counter only
        with counter:
            loss = forward_backward(cfg, topo, parts, stages, sched, mbs, opts, calls if sched is None else None)
        per_step.append(counter.table())         # running totals; per step: differences
        if capture_grads and it == 0:
            grads = full_grads(parts, coords)
        norm = grad_norm(params, coords)
        clip_(params, cfg.clip_grad, norm)
        opt.step()
        losses.append(_global_loss(loss, coords, topo))
        norms.append(norm)
        times.append((now() - t0) * 1e3)
        if rank == 0 and log_line is not None and log_interval and ((it + 1) % log_interval == 0 or it + 1 == steps):
            send_to_parent(log_line(it + 1, steps, (it + 1) * gbs, times[-1], cfg.lr, gbs, losses[-1], norm))
    extra = {"coords": coords, "comm": counter.table(), "comm_last_step": _difference(per_step),
             "comm_sequence": list(counter.log),
             "comm_debug": calls if sched is None else None,
             "memory": None,
             "implementation": "native", "schedule": schedule_of(cfg, opts)}
    return {"losses": losses, "grad_norms": norms, "iteration_ms": times, "extra": extra,
            "grads": grads, "moe": None, "loss_scales": [1.0] * steps, "skipped": [False] * steps}


def _global_loss(loss, coords: dict, topo) -> float:
    """The global batch's loss on every rank: the dp replicas' means (tp rank 0 of a rank that
    computes it) summed over the world and divided by dp (a bookkeeping all-reduce, not counted)."""
    mine = loss if loss is not None and coords["tp"] == 0 else 0.0
    t = torch.tensor([float(mine)], dtype=torch.float64)
    dist.all_reduce(t)
    return float(t) / topo.dp


def _difference(tables: list) -> dict:
    """The last step's counts: the last running total minus the one before (the first step of a
    pipeline also carries the stages' shape inference)."""
    last, before = tables[-1], (tables[-2] if len(tables) > 1 else {})
    out = {}
    for axis, ops in last.items():
        for op, c in ops.items():
            b = before.get(axis, {}).get(op, {"calls": 0, "bytes": 0.0})
            if c["calls"] - b["calls"]:
                out.setdefault(axis, {})[op] = {"calls": c["calls"] - b["calls"], "bytes": c["bytes"] - b["bytes"]}
    return out

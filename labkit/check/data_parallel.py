"""Checks for the Data-parallelism lab: the bucket hook of a bucketed DDP, and the ZeRO-1 step.

``bucket_hook(student_fn)``: ``student_fn(bucket, param)`` is called by
:class:`labkit.data_parallel.BucketedDataParallel` when ``param``'s gradient is final; it must
launch the bucket's all-reduce of (gradients / dp) when the bucket is complete.
``zero1_step(student_fn)``: ``student_fn(group, flat_params, flat_grads, shard, optimizer)`` runs
after the backward: reduce-scatter the gradients, update this rank's shard, all-gather.

Both run the student's code on N gloo ranks for 3 AdamW steps with gradient accumulation (2
microbatches) in float64 and compare with single-device training (labkit.reference): the averaged
gradients of step 1, the parameters after every step, and the bytes sent with labkit.calc's.
labkit's own hook (``ddp.on_grad_ready``) and ZeRO-1 step (``ZeRO1.finish_grad_sync``/``step``)
raise while the student's code runs. The ZeRO-2 exercise is in ``zero.py``.
"""
from __future__ import annotations

import functools

from . import describe_mismatch, forbidden, hint, report, run_student

OWN_HOOK = ("labkit.data_parallel.ddp:on_grad_ready",)
OWN_ZERO1 = ("labkit.data_parallel.zero:ZeRO1.finish_grad_sync", "labkit.data_parallel.zero:ZeRO1.step",
             "labkit.data_parallel.zero:_ShardedDataParallel._reduce_scatter")

STEPS, GBS, TOL = 3, 8, 1e-10  # float64: only the order of additions differs
MODEL = dict(num_layers=1, hidden_size=32, num_attention_heads=4, seq_length=16, params_dtype="float64")


def _setup(mbs: int):
    import torch

    from .. import data
    from ..groups import world_group
    from ..config import TrainConfig
    from ..model import GPT
    cfg = TrainConfig(micro_batch_size=mbs, global_batch_size=GBS, **MODEL)
    model = GPT(cfg.model_config(), seed=0).to(torch.float64)
    return cfg, model, world_group(), data


def _microbatches(data, group, it, mbs):
    x, y = data.get_batch(data.load_tokens(), it, GBS, MODEL["seq_length"], 0)
    return data.microbatches(x, y, mbs, group.size, group.rank)


def _bucket_worker(student_fn, bucket_size: int):
    from ..data_parallel.ddp import BucketedDataParallel
    mbs = GBS // 2 // _world()
    cfg, model, group, data = _setup(mbs)
    dp = BucketedDataParallel(list(model.named_parameters()), group, cfg, bucket_size, hook=student_fn)
    out = {"params": [], "grads": None, "unlaunched": [], "sent": []}
    for it in range(STEPS):
        group.stats.reset()
        mbatches = _microbatches(data, group, it, mbs)
        for j, (x, y) in enumerate(mbatches):
            with dp.grad_sync_context(is_last_microbatch=(j == len(mbatches) - 1)), \
                    forbidden(*OWN_HOOK, why="the hook is the exercise"):
                (model.loss(x, y) / len(mbatches)).backward()
        if group.size > 1:  # every bucket should be in flight before the backward returned
            out["unlaunched"] = [b.index for b in dp.buckets if b.work is None] or out["unlaunched"]
        dp.finish_grad_sync()
        if it == 0:
            out["grads"] = {n: p.grad.clone() for n, p in model.named_parameters()}
        dp.step()
        out["params"].append(dp.full_parameters())
        out["sent"].append(group.stats.bytes.get("all_reduce", 0.0))
    return out


def _zero1_worker(student_fn):
    from ..data_parallel.zero import ZeRO1
    mbs = GBS // 2 // _world()
    cfg, model, group, data = _setup(mbs)
    dp = ZeRO1(list(model.named_parameters()), group, cfg)
    out = {"params": [], "grad_shard": None, "sent": [], "range": (dp.lo, dp.hi)}
    for it in range(STEPS):
        group.stats.reset()
        mbatches = _microbatches(data, group, it, mbs)
        for x, y in mbatches:   # gradients accumulate into dp.flat_grad (p.grad are views of it)
            (model.loss(x, y) / len(mbatches)).backward()
        with forbidden(*OWN_ZERO1, why="the ZeRO-1 step is the exercise"):
            student_fn(group, dp.flat, dp.flat_grad, dp.shard, dp.optimizer)
        if it == 0:
            out["grad_shard"] = None if dp.shard.grad is None else dp.shard.grad.clone()
        dp.flat_grad.zero_()
        out["params"].append(dp.full_parameters())
        out["sent"].append({op: v for op, v in group.stats.bytes.items()})
    return out


def _world() -> int:
    import torch.distributed as dist
    return dist.get_world_size()


@functools.lru_cache(maxsize=1)
def _reference():
    """Single-device: parameters after each step and the gradient of step 1 (float64). Computed once
    per process: the three DP checks of the lab share it."""
    from .. import data
    from ..reference import train_reference
    params = [dict(train_reference(steps=k, return_model=True, micro_batch_size=GBS, global_batch_size=GBS,
                                   **MODEL)["model"].named_parameters()) for k in range(STEPS + 1)]
    model = train_reference(steps=0, return_model=True, micro_batch_size=GBS, global_batch_size=GBS,
                            **MODEL)["model"]
    x, y = data.get_batch(data.load_tokens(), 0, GBS, MODEL["seq_length"], 0)
    model.loss(x, y).backward()
    return params[1:], {n: p.grad for n, p in model.named_parameters()}


def _compare_params(title, results, ref_params, make_hint):
    """The first parameter that differs from one device's after some step, reported; or None."""
    for r, out in enumerate(results):
        for k, expected in enumerate(ref_params):
            for n, e in expected.items():
                problem = describe_mismatch(out["params"][k][n], e.detach(), TOL, TOL, f"rank {r}, step {k + 1}, {n} ")
                if problem:
                    return report(title, False, problem, make_hint())
    return None


def bucket_hook(student_fn, world_size: int = 2, bucket_size: int = 2000):
    """Run a BucketedDataParallel whose hook is ``student_fn``; print one [check] line."""
    name, title = "bucket_hook", f"bucket_hook ({world_size} ranks)"
    results, failed = run_student(title, _bucket_worker, world_size, student_fn, bucket_size,
                                  student_fn=student_fn)
    if failed is not None:
        return failed
    if results[0]["unlaunched"]:
        return report(title, False, f"buckets {results[0]['unlaunched']} had no all-reduce in flight when "
                      "the backward returned", hint(name, student_fn, [
                          "a bucket must be launched by the hook itself, during the backward",
                          "launch when the bucket's last gradient is ready: len(bucket.ready) == "
                          "len(bucket.params); store the handle in bucket.work"], "launch"))
    ref_params, ref_grads = _reference()
    for n, g in ref_grads.items():
        got = results[0]["grads"][n]
        problem = describe_mismatch(got, g, TOL, TOL, f"averaged gradient of {n}, ")
        if problem:
            ratio = float(got.double().norm() / g.double().norm())
            text = ([f"the gradients are {ratio:.3g}x the mean: the all-reduce sums, the step needs the "
                     f"mean over the {world_size} ranks"] if abs(ratio - world_size) < 1e-6 else
                    ["the averaged gradients differ from one device's",
                     "bucket.buffer must be the bucket's gradients, concatenated in the order of "
                     "bucket.params, divided by dp"])
            return report(title, False, problem, hint(name, student_fn, text, "grads"))
    failed = _compare_params(title, results, ref_params, lambda: hint(
        name, student_fn, "the gradients matched: do not modify parameters in the hook", "params"))
    if failed is not None:
        return failed
    from ..calc.comm import ring_all_reduce_bytes
    expected = ring_all_reduce_bytes(sum(p.numel() for p in ref_params[0].values()) * 8, world_size)
    for r, out in enumerate(results):
        if any(abs(s - expected) > 0.5 for s in out["sent"]):
            return report(title, False, f"rank {r} sent {out['sent']} bytes per step; one all-reduce of "
                          f"every gradient sends {expected:.0f}",
                          hint(name, student_fn, "launch each bucket exactly once per step", "bytes"))
    return report(title, True, f"buckets all-reduced during the backward, once per step with 2 microbatches; "
                  f"gradients and 3 AdamW steps equal one device's (float64, tol {TOL:g}); "
                  f"{expected:.0f} bytes per rank per step = 2(n-1)/n x gradient bytes")


def zero1_step(student_fn, world_size: int = 4):
    """Run ZeRO-1 with ``student_fn`` as its step; print one [check] line."""
    name, title = "zero1_step", f"zero1_step ({world_size} ranks)"
    results, failed = run_student(title, _zero1_worker, world_size, student_fn, student_fn=student_fn)
    if failed is not None:
        return failed
    import torch
    ref_params, ref_grads = _reference()
    ref_flat = torch.cat([g.reshape(-1) for g in ref_grads.values()])
    for r, out in enumerate(results):
        lo, hi = out["range"]
        if out["grad_shard"] is None:
            return report(title, False, f"rank {r}: shard.grad is None after your step",
                          hint(name, student_fn, "set shard.grad to your shard of the averaged gradient "
                               "before optimizer.step()", "none"))
        padded = torch.nn.functional.pad(ref_flat, (0, (hi - lo) * world_size - ref_flat.numel()))
        expected = padded[lo:hi]  # the flat buffer is zero-padded to a multiple of dp
        problem = describe_mismatch(out["grad_shard"], expected, TOL, TOL, f"rank {r}, gradient shard, ")
        if problem:
            return report(title, False, problem, hint(name, student_fn, [
                "shard.grad is not this rank's shard of the mean gradient",
                "reduce-scatter flat_grads (it returns rank r's elements [r*S, (r+1)*S) of the SUM "
                "over ranks) and divide by group.size"], "grads"))
    failed = _compare_params(title, results, ref_params, lambda: hint(
        name, student_fn, ["the gradient shards are right; after optimizer.step() only this rank's shard "
                           "of the weights is new, the other ranks' updates never reach it (all-gather)",
                           "flat_params.copy_(comm.all_gather(group, shard.detach()))"], "params"))
    if failed is not None:
        return failed
    from ..calc.comm import dp_step_bytes
    num_params = sum(p.numel() for p in ref_params[0].values())
    expected = dp_step_bytes(num_params * 8, world_size, zero_stage=1)
    for r, out in enumerate(results):
        for k, sent in enumerate(out["sent"]):
            if sent != expected:
                return report(title, False, f"rank {r}, step {k + 1}: sent {sent}, ZeRO-1 sends {expected}",
                              hint(name, student_fn, "one reduce-scatter of the gradients and one "
                                   "all-gather of the parameters (an all-reduce would send the "
                                   "gradients twice over)", "bytes"))
    return report(title, True, f"gradient shards, and parameters after {STEPS} AdamW steps, equal one device's "
                  f"(float64, tol {TOL:g}); per step each rank sent {expected}, as labkit.calc says")

"""Checks for the Data-parallelism lab: the bucket hook of a bucketed DDP, and the ZeRO-1 step.

``bucket_hook(student_fn)``: ``student_fn(bucket, param)`` is called by
:class:`labkit.data_parallel.BucketedDataParallel` when ``param``'s gradient is final; it must
launch the bucket's all-reduce of (gradients / dp) when the bucket is complete.
``zero1_step(student_fn)``: ``student_fn(group, flat_params, flat_grads, shard, optimizer)`` runs
after the backward: reduce-scatter the gradients, update this rank's shard, all-gather.

Both run the student's code on N gloo ranks for 3 AdamW steps with gradient accumulation (2
microbatches) in float64; the judge compares with single-device training (``labkit.reference``,
computed in the judge's process): the averaged gradients of step 1, the parameters after every
step, and the bytes of each step, counted on every group below labkit
(:mod:`labkit.check.instrument`), with labkit.calc's. labkit's own hook and ZeRO-1 step raise while
the student's code runs. The ZeRO-2 exercise is in ``zero.py``.
"""
from __future__ import annotations

from . import describe_mismatch, report, sent, zero
from .dp_common import GBS, MODEL, STEPS, TOL, _microbatches, _setup, _world, compare_params, reference  # noqa: F401
from .spec import Spec, failed, ranks, run
from .compare import far

OWN_HOOK = ("labkit.data_parallel.ddp:on_grad_ready",)
OWN_ZERO1 = ("labkit.data_parallel.zero:ZeRO1.finish_grad_sync", "labkit.data_parallel.zero:ZeRO1.step",
             "labkit.data_parallel.zero:_ShardedDataParallel._reduce_scatter")

def _bucket_worker(student, bucket_size: int, seed: int):
    from ..data_parallel.ddp import BucketedDataParallel
    from . import instrument
    instrument.install()
    hook = student.load()["hook"]
    mbs = GBS // 2 // _world()
    cfg, model, group, data = _setup(mbs, seed)
    dp = BucketedDataParallel(list(model.named_parameters()), group, cfg, bucket_size, hook=hook)
    out = {"params": [], "grads": None, "unlaunched": [], "sent": []}
    for it in range(STEPS):
        mbatches = _microbatches(data, group, it, mbs, seed)
        before = instrument.snapshot()
        for j, (x, y) in enumerate(mbatches):
            with dp.grad_sync_context(is_last_microbatch=(j == len(mbatches) - 1)), \
                    student.banning(OWN_HOOK, "the hook is the exercise"):
                (model.loss(x, y) / len(mbatches)).backward()
        if group.size > 1:  # every bucket should be in flight before the backward returned
            out["unlaunched"] = [b.index for b in dp.buckets if b.work is None] or out["unlaunched"]
        dp.finish_grad_sync()
        out["sent"].append(instrument.difference(instrument.snapshot(), before))
        if it == 0:
            out["grads"] = {n: p.grad.clone() for n, p in model.named_parameters()}
        dp.step()
        out["params"].append(dp.full_parameters())
    return out


def _zero1_worker(student, seed: int):
    from ..data_parallel.zero import ZeRO1
    from . import instrument
    instrument.install()
    step = student.load()["step"]
    mbs = GBS // 2 // _world()
    cfg, model, group, data = _setup(mbs, seed)
    dp = ZeRO1(list(model.named_parameters()), group, cfg)
    out = {"params": [], "grad_shard": None, "sent": [], "range": [dp.lo, dp.hi]}
    for it in range(STEPS):
        mbatches = _microbatches(data, group, it, mbs, seed)
        for x, y in mbatches:   # gradients accumulate into dp.flat_grad (p.grad are views of it)
            (model.loss(x, y) / len(mbatches)).backward()
        before = instrument.snapshot()
        with student.banning(OWN_ZERO1, "the ZeRO-1 step is the exercise"):
            step(group, dp.flat, dp.flat_grad, dp.shard, dp.optimizer)
        out["sent"].append(instrument.difference(instrument.snapshot(), before))
        if it == 0:
            out["grad_shard"] = None if dp.shard.grad is None else dp.shard.grad.clone()
        dp.flat_grad.zero_()
        out["params"].append(dp.full_parameters())
    return out


# -- exercise 1: the bucket hook -------------------------------------------------------------------
def _produce_bucket(student, world_size=2, bucket_size=2000, seed=0):
    results, failure = ranks(_bucket_worker, world_size, student, bucket_size, seed)
    return failure or results


def _judge_bucket(data, world_size=2, bucket_size=2000, seed=0):
    title = f"bucket_hook ({world_size} ranks)"
    bad = failed(title, data)
    if bad is not None:
        return bad
    if data[0]["unlaunched"]:
        return report(title, False, f"buckets {data[0]['unlaunched']} had no all-reduce in flight when the "
                      "backward returned", "a bucket must be launched by the hook itself, during the backward")
    ref_params, ref_grads = reference(seed)
    for n, g in ref_grads.items():
        got = data[0]["grads"][n]
        problem = describe_mismatch(got, g, TOL, TOL, f"averaged gradient of {n}, ")
        if problem:
            ratio = float(got.double().norm() / g.double().norm())
            text = (f"the gradients are {ratio:.3g}x the mean: the all-reduce sums, the step needs the mean over "
                    f"the {world_size} ranks" if abs(ratio - world_size) < 1e-6 else
                    "the averaged gradients differ from one device's")
            return report(title, False, problem, text)
    bad = compare_params(title, data, ref_params, "the gradients matched: do not modify parameters in the hook")
    if bad is not None:
        return bad
    from ..calc.comm import ring_all_reduce_bytes
    expected = ring_all_reduce_bytes(sum(p.numel() for p in ref_params[0].values()) * 8, world_size)
    for r, out in enumerate(data):
        per_step = [sent(s) for s in out["sent"]]
        if any(far(s, expected, 0.5) for s in per_step) or any(set(s) - {"all_reduce"} for s in out["sent"]):
            ops = ", ".join(f"{op} {v['bytes']:.0f}" for op, v in sorted(out["sent"][0].items())) or "nothing"
            return report(title, False, f"rank {r} sent {ops} bytes in step 1; one all-reduce of every gradient "
                          f"sends {expected:.0f}", "launch each bucket exactly once per step")
    return report(title, True, f"buckets all-reduced during the backward, once per step with 2 microbatches; "
                  f"gradients and 3 AdamW steps equal one device's (float64, tol {TOL:g}); "
                  f"{expected:.0f} bytes per rank per step = 2(n-1)/n x gradient bytes")


BUCKET_HOOK = Spec(
    "bucket-hook", {"hook": "my_hook"}, _produce_bucket, _judge_bucket, cases=({"world_size": 2},),
    forbid=OWN_HOOK, ranks=True, why="the hook is the exercise", hints=(
        "the hook runs once per parameter: record it in bucket.ready; only the parameter that completes "
        "the bucket launches anything",
        "launch when len(bucket.ready) == len(bucket.params): bucket.buffer = the bucket's gradients, "
        "flattened in the order of bucket.params, divided by bucket.group.size",
        "bucket.work = all_reduce_async(bucket.group, bucket.buffer), and return without waiting"))


def bucket_hook(student_fn, world_size: int = 2, bucket_size: int = 2000, seed: int = 0):
    """Run a BucketedDataParallel whose hook is ``student_fn``; print one [check] line."""
    return run(BUCKET_HOOK, {"hook": student_fn}, world_size=world_size, bucket_size=bucket_size, seed=seed)


# -- exercise 2: the ZeRO-1 step -------------------------------------------------------------------
def _produce_zero1(student, world_size=4, seed=0):
    results, failure = ranks(_zero1_worker, world_size, student, seed)
    return failure or results


def _judge_zero1(data, world_size=4, seed=0):
    import torch
    title = f"zero1_step ({world_size} ranks)"
    bad = failed(title, data)
    if bad is not None:
        return bad
    ref_params, ref_grads = reference(seed)
    ref_flat = torch.cat([g.reshape(-1) for g in ref_grads.values()])
    for r, out in enumerate(data):
        lo, hi = out["range"]
        if out["grad_shard"] is None:
            return report(title, False, f"rank {r}: shard.grad is None after your step",
                          "set shard.grad to your shard of the averaged gradient before optimizer.step()")
        padded = torch.nn.functional.pad(ref_flat, (0, (hi - lo) * world_size - ref_flat.numel()))
        problem = describe_mismatch(out["grad_shard"], padded[lo:hi], TOL, TOL, f"rank {r}, gradient shard, ")
        if problem:
            return report(title, False, problem, "shard.grad is not this rank's shard of the mean gradient")
    bad = compare_params(title, data, ref_params, "the gradient shards are right; after optimizer.step() only "
                         "this rank's shard of the weights is new: the other ranks' updates never reach it "
                         "(all-gather)")
    if bad is not None:
        return bad
    from ..calc.comm import dp_step_bytes
    num_params = sum(p.numel() for p in ref_params[0].values())
    expected = dp_step_bytes(num_params * 8, world_size, zero_stage=1)
    for r, out in enumerate(data):
        for k, step in enumerate(out["sent"]):
            got = {op: v["bytes"] for op, v in step.items()}
            if set(got) != set(expected) or any(far(got[op], expected[op], 0.5) for op in expected):
                return report(title, False, f"rank {r}, step {k + 1}: sent {got}, ZeRO-1 sends {expected}",
                              "one reduce-scatter of the gradients and one all-gather of the parameters (an "
                              "all-reduce would send the gradients twice over)")
    return report(title, True, f"gradient shards, and parameters after {STEPS} AdamW steps, equal one device's "
                  f"(float64, tol {TOL:g}); per step each rank sent {expected}, as labkit.calc says")


ZERO1 = Spec(
    "zero1-step", {"step": "my_zero1_step"}, _produce_zero1, _judge_zero1, cases=({"world_size": 4},),
    forbid=OWN_ZERO1, ranks=True, why="the ZeRO-1 step is the exercise", hints=(
        "three moves: this rank's shard of the MEAN gradient, the optimizer on the shard only, every "
        "rank's new shard everywhere",
        "reduce-scatter flat_grads (it returns rank r's elements [r*S, (r+1)*S) of the SUM over ranks) and "
        "divide by group.size; assign it to shard.grad",
        "after optimizer.step(): flat_params.copy_(comm.all_gather(group, shard.detach()))"))


def zero1_step(student_fn, world_size: int = 4, seed: int = 0):
    """Run ZeRO-1 with ``student_fn`` as its step; print one [check] line."""
    return run(ZERO1, {"step": student_fn}, world_size=world_size, seed=seed)


SPECS = {s.id: s for s in (BUCKET_HOOK, ZERO1, zero.ZERO2)}


def hint(exercise_id: str) -> str:
    """Print the next hint of ``exercise_id`` ("bucket-hook", "zero1-step", "zero2-hook")."""
    from .hints import asker
    return asker(SPECS)(exercise_id)

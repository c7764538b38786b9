"""Check for the ZeRO-2 exercise of the Data-parallelism lab, and the gradient-memory peaks it reports.

ZeRO stage 2 (Rajbhandari et al. 2020, Sec. 5.2) shards the gradients: a rank keeps only the
gradient of the 1/dp of the parameters it updates. DeepSpeed's stage 2 and Megatron-LM's
distributed optimizer get there bucket by bucket during the backward: as soon as a bucket's
gradients are final they are reduce-scattered, and the full ones are freed. labkit's own
``ZeRO2`` (``labkit/data_parallel/zero.py``) is simpler: it reduce-scatters the whole model's
gradients once the backward has ended, so for a moment it holds every full gradient AND a flat
copy of them (:func:`gradient_peaks` measures it). The exercise writes the bucketed version.

Layout (Megatron's ``param_and_grad_buffer.py``): each bucket's flat gradient is padded to a
multiple of dp and dp rank r owns chunk r of every bucket. ``student_fn(bucket, param)`` is called
(in every microbatch's backward) when ``param``'s gradient is final; a :class:`ZeroBucket` has
``params``, ``ready`` (a set to fill with ``id(param)``), ``group``, ``numel``, ``padded_numel``
and ``grad_shard`` ([padded_numel / dp], this rank's accumulated shard of the mean gradient).

The check runs 3 AdamW steps with 2 microbatches on 2 gloo ranks in float64 and compares the
parameters after every step with single-device training (``labkit.reference``), and measures
the gradient bytes the rank held at its peak: at every gradient accumulation and at every
``labkit.comm.reduce_scatter`` call (the distinct storages of all ``.grad`` tensors, the shards
and the tensor being reduce-scattered). labkit's ``ZeRO2`` raises while the student's code runs;
its peak and ZeRO-1's (:func:`gradient_peaks`) are measured in the judge's process.

Retargeting (issue 21, per-layer FSDP and Megatron's ZeRO-2 in labkit): the exercise owns its
bucket layout (:class:`ZeroBucket`, Megatron's padded buckets) and compares with labkit's stages
only through ``ZERO_STAGES`` and :func:`gradient_peaks`; pointing ``OWN_ZERO2`` and those two at the
new implementation is the whole change.
"""
from __future__ import annotations

import contextlib
import functools

from . import report, sent
from .dp_common import GBS, MODEL, STEPS, TOL, _microbatches, _setup, _world, compare_params, reference
from .spec import Spec, failed, ranks, run
from .compare import far

OWN_ZERO2 = ("labkit.data_parallel.zero:ZeRO2._shard_grads",)


class ZeroBucket:
    """The parameters whose gradients are reduce-scattered together, and this rank's shard of them."""

    def __init__(self, index: int, params: list, group):
        import torch
        self.index, self.params, self.group = index, params, group
        self.numel = sum(p.numel() for p in params)
        self.padded_numel = -(-self.numel // group.size) * group.size
        self.ready: set[int] = set()
        self.grad_shard = torch.zeros(self.padded_numel // group.size, dtype=params[0].dtype)
        self.weight_shard = None      # nn.Parameter [padded_numel / dp], set by the check


class GradMeter:
    """The most gradient bytes held at once, sampled when gradients appear and when they are sent."""

    def __init__(self, params, extra=lambda: ()):
        self.params, self.extra, self.peak = params, extra, 0

    def sample(self, *also) -> None:
        from ..data_parallel.shard_layout import storage_bytes
        held = storage_bytes([p.grad for p in self.params] + list(self.extra()) + list(also))
        self.peak = max(self.peak, held)

    @contextlib.contextmanager
    def watching(self):
        """Sample at every gradient accumulation and inside every ``labkit.comm.reduce_scatter``."""
        from .. import comm
        original = comm.reduce_scatter

        def reduce_scatter(group, x, *args, **kwargs):
            self.sample(x)
            return original(group, x, *args, **kwargs)
        handles = [p.register_post_accumulate_grad_hook(lambda p: self.sample()) for p in self.params]
        comm.reduce_scatter = reduce_scatter
        try:
            yield self
        finally:
            comm.reduce_scatter = original
            for h in handles:
                h.remove()


def _labkit_peak(stage: int) -> int:
    """Peak gradient bytes of labkit's ZeRO-1 or ZeRO-2 over one step of 2 microbatches (on a rank)."""
    from ..data_parallel.zero import ZERO_STAGES
    mbs = GBS // 2 // _world()
    cfg, model, group, data = _setup(mbs)
    dp = ZERO_STAGES[stage](list(model.named_parameters()), group, cfg)
    extra = (lambda: [dp.flat_grad]) if stage == 1 else (lambda: [dp.grad_shard])
    meter = GradMeter(list(model.parameters()), extra)
    mbatches = _microbatches(data, group, 0, mbs)
    with meter.watching():
        for j, (x, y) in enumerate(mbatches):
            with dp.grad_sync_context(is_last_microbatch=(j == len(mbatches) - 1)):
                (model.loss(x, y) / len(mbatches)).backward()
        dp.finish_grad_sync()
    return meter.peak


def _worker(student, bucket_size: int, seed: int):
    import torch

    from .. import comm
    from ..data_parallel.ddp import make_buckets, make_optimizer
    from . import instrument
    instrument.install()
    hook = student.load()["hook"]
    mbs = GBS // 2 // _world()
    cfg, model, group, data = _setup(mbs, seed)
    params = list(model.parameters())
    with torch.no_grad():                               # start from rank 0's weights
        for p in params:
            p.copy_(comm.broadcast(group, p.detach(), src=0))
    buckets = [ZeroBucket(b.index, b.params, group) for b in make_buckets(params, bucket_size, None)]
    r, n = group.rank, group.size
    for b in buckets:                                   # this rank's chunk of the bucket's weights
        flat = torch.nn.functional.pad(torch.cat([p.detach().reshape(-1) for p in b.params]),
                                       (0, b.padded_numel - b.numel))
        b.weight_shard = torch.nn.Parameter(flat.chunk(n)[r].clone())
        for p in b.params:
            p.register_post_accumulate_grad_hook(lambda p, b=b: hook(b, p))
    optimizer = make_optimizer([b.weight_shard for b in buckets], cfg)
    meter = GradMeter(params, lambda: [b.grad_shard for b in buckets])
    out = {"params": [], "held_after_backward": [], "sent": []}
    for it in range(STEPS):
        mbatches = _microbatches(data, group, it, mbs, seed)
        before = instrument.snapshot()
        for x, y in mbatches:
            with meter.watching(), student.banning(OWN_ZERO2, "the bucketed ZeRO-2 hook is the exercise"):
                (model.loss(x, y) / len(mbatches)).backward()
            held = sorted({b.index for b in buckets for p in b.params if p.grad is not None})
            out["held_after_backward"] = out["held_after_backward"] or held
            for p in params:
                p.grad = None                           # whatever was left: the next microbatch starts clean
        out["sent"].append(instrument.difference(instrument.snapshot(), before))
        with torch.no_grad():                           # the check's own step: shards -> AdamW -> gather
            for b in buckets:
                b.weight_shard.grad = b.grad_shard.clone()
            optimizer.step()
            for b in buckets:
                full = comm.all_gather(group, b.weight_shard.detach())[:b.numel]
                offset = 0
                for p in b.params:
                    p.copy_(full[offset:offset + p.numel()].view_as(p))
                    offset += p.numel()
                b.grad_shard.zero_()
        out["params"].append({k: v.detach().clone() for k, v in model.named_parameters()})
    out["peak"] = meter.peak
    out["largest_bucket"] = max(b.numel for b in buckets) * params[0].element_size()
    out["shard_bytes"] = sum(b.grad_shard.numel() for b in buckets) * params[0].element_size()
    out["full_bytes"] = sum(p.numel() for p in params) * params[0].element_size()
    return out


def _produce(student, world_size=2, bucket_size=2000, seed=0):
    results, failure = ranks(_worker, world_size, student, bucket_size, seed)
    return failure or results


def _judge(data, world_size=2, bucket_size=2000, seed=0):
    title = f"zero2_bucket_hook ({world_size} ranks)"
    bad = failed(title, data)
    if bad is not None:
        return bad
    out = data[0]
    if out["held_after_backward"]:
        return report(title, False, f"after a microbatch's backward rank 0 still held the full gradients of "
                      f"buckets {out['held_after_backward']}", "a ZeRO-2 rank keeps no full gradient once "
                      "its bucket has been reduced")
    ref_params, _ = reference(seed)
    bad = compare_params(title, data, ref_params, "the weights after the step differ from one device's: the "
                         "shards of the mean gradient are wrong")
    if bad is not None:
        return bad
    from ..calc.comm import reduce_scatter_bytes
    per_microbatch = sum(reduce_scatter_bytes(b, world_size) for b in _padded_bucket_bytes(bucket_size, world_size))
    for step in out["sent"]:
        got = sent(step, "reduce_scatter")
        if set(step) - {"reduce_scatter"} or far(got, 2 * per_microbatch, 0.5):
            ops = ", ".join(f"{op} {v['bytes']:.0f}" for op, v in sorted(step.items())) or "nothing"
            return report(title, False, f"rank 0 sent {ops} bytes in a step of 2 microbatches; one reduce-scatter "
                          f"per bucket and microbatch is {2 * per_microbatch:.0f}",
                          "reduce-scatter each bucket once, when its last gradient is ready, then clear bucket.ready")
    transient = out["peak"] - out["shard_bytes"]
    if transient > 2 * out["largest_bucket"]:
        return report(title, False, f"peak of {out['peak']} gradient bytes: {transient} beyond the shards, "
                      f"more than two buckets' worth ({2 * out['largest_bucket']})",
                      "free each bucket's gradients right after its reduce-scatter")
    peaks = gradient_peaks(world_size)
    return report(title, True, f"3 AdamW steps equal one device's (float64, tol {TOL:g}); gradient peak "
                  f"{out['peak']:,} bytes = shards {out['shard_bytes']:,} + {transient:,} in flight (the "
                  f"largest bucket is {out['largest_bucket']:,}); labkit's ZeRO2 peaks at "
                  f"{peaks['zero2']:,}, ZeRO-1 at {peaks['zero1']:,} (full gradient {out['full_bytes']:,})")


ZERO2 = Spec(
    "zero2-hook", {"hook": "my_zero2_hook"}, _produce, _judge, cases=({"world_size": 2},), forbid=OWN_ZERO2,
    ranks=True, why="the bucketed ZeRO-2 hook is the exercise", hints=(
        "the hook runs in every microbatch's backward: mark the parameter ready; act only when the bucket is "
        "complete, and leave bucket.ready empty for the next microbatch",
        "bucket.grad_shard must ADD (microbatches accumulate) this rank's chunk of the bucket's flat gradient, "
        "padded to bucket.padded_numel, summed over ranks and divided by bucket.group.size",
        "flat = F.pad(torch.cat([p.grad.reshape(-1) for p in bucket.params]), (0, bucket.padded_numel - "
        "bucket.numel)); bucket.grad_shard += comm.reduce_scatter(bucket.group, flat) / bucket.group.size; "
        "then p.grad = None for every p and bucket.ready.clear()"))


def zero2_bucket_hook(student_fn, world_size: int = 2, bucket_size: int = 2000, seed: int = 0):
    """Run bucketed ZeRO-2 with ``student_fn`` as the hook; print one [check] line."""
    return run(ZERO2, {"hook": student_fn}, world_size=world_size, bucket_size=bucket_size, seed=seed)


def _padded_bucket_bytes(bucket_size: int, dp: int) -> list[int]:
    """Bytes of each bucket's padded flat gradient for the check's model (float64)."""
    from ..data_parallel.ddp import make_buckets
    from ..model import GPT
    from ..config import TrainConfig
    model = GPT(TrainConfig(micro_batch_size=1, global_batch_size=GBS, **MODEL).model_config(), seed=0)
    sizes = [b.numel for b in make_buckets(list(model.parameters()), bucket_size, None)]
    return [-(-s // dp) * dp * 8 for s in sizes]


@functools.lru_cache(maxsize=4)
def gradient_peaks(world_size: int = 2) -> dict:
    """{"zero1", "zero2"}: the most gradient bytes rank 0 of labkit's ZeRO-1 and ZeRO-2 held during
    one step of 2 microbatches (float64 GPT of ``data_parallel.MODEL``), and ``"full"``, the bytes of
    one full gradient. The chapter "Data parallelism" prints them."""
    from ..launcher import launch
    out = launch(_peaks_worker, world_size)[0]
    return out


def _peaks_worker():
    from ..model import GPT
    from ..config import TrainConfig
    full = sum(p.numel() for p in GPT(TrainConfig(micro_batch_size=1, global_batch_size=GBS, **MODEL)
                                      .model_config(), seed=0).parameters()) * 8
    return {"zero1": _labkit_peak(1), "zero2": _labkit_peak(2), "full": full}

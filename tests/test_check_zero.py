"""The ZeRO-2 exercise's check (labkit/check/zero.py) and its gradient meter.

Tier 1: ``GradMeter`` counts distinct storages at its samples. Tier 2: the check passes a correct
bucketed hook (written here, independently of the lab's solution), and FAILs a hook that keeps the
full gradients, one that forgets the mean, one that reduces twice; labkit's ZeRO-2 is refused
while the hook runs; labkit's own ZeRO-1 and ZeRO-2 peaks are the numbers the chapter explains.
About 40 s on the 2-core machine.
"""
import torch
import torch.nn.functional as F

from labkit import comm
from labkit.check import zero as Z


def test_grad_meter_counts_distinct_storages_at_its_samples():
    a, b = torch.nn.Parameter(torch.zeros(4)), torch.nn.Parameter(torch.zeros(6))   # float32
    flat = torch.zeros(10)
    meter = Z.GradMeter([a, b], extra=lambda: [flat])
    a.grad, b.grad = flat[:4].view(4), flat[4:].view(6)     # views of one buffer count once
    meter.sample()
    assert meter.peak == 40
    a.grad, b.grad = torch.zeros(4), torch.zeros(6)           # own storages now: 16 + 24 + 40
    meter.sample(torch.zeros(10))                             # plus what is being sent
    assert meter.peak == 120


def _flat(bucket):
    return F.pad(torch.cat([p.grad.reshape(-1) for p in bucket.params]), (0, bucket.padded_numel - bucket.numel))


def hook_ok(bucket, param):
    bucket.ready.add(id(param))
    if len(bucket.ready) == len(bucket.params):
        bucket.grad_shard += comm.reduce_scatter(bucket.group, _flat(bucket)) / bucket.group.size
        for p in bucket.params:
            p.grad = None
        bucket.ready.clear()


def hook_keeps_grads(bucket, param):
    bucket.ready.add(id(param))
    if len(bucket.ready) == len(bucket.params):
        bucket.grad_shard += comm.reduce_scatter(bucket.group, _flat(bucket)) / bucket.group.size
        bucket.ready.clear()


def hook_sums(bucket, param):
    bucket.ready.add(id(param))
    if len(bucket.ready) == len(bucket.params):
        bucket.grad_shard += comm.reduce_scatter(bucket.group, _flat(bucket))      # no / dp
        for p in bucket.params:
            p.grad = None
        bucket.ready.clear()


def hook_calls_labkit(bucket, param):
    from labkit.data_parallel.zero import ZeRO2
    ZeRO2._shard_grads(None)


def test_bucketed_zero2_passes_and_its_peak_is_below_labkits():
    result = Z.zero2_bucket_hook(hook_ok)
    assert result, result.line()
    # the numbers the chapter explains: labkit's ZeRO-2 holds 2.5 full gradients at dp 2, ZeRO-1 one
    full, peaks = 171_776, Z.gradient_peaks(world_size=2)
    assert peaks == {"zero1": full, "zero2": full * 5 // 2, "full": full}
    assert f"labkit's ZeRO2 peaks at {full * 5 // 2:,}, ZeRO-1 at {full:,}" in result.message


def test_mistakes_fail_with_what_differs():
    kept = Z.zero2_bucket_hook(hook_keeps_grads)
    assert not kept and "still held the full gradients of buckets [0, 1, 2, 3]" in kept.message, kept.line()
    summed = Z.zero2_bucket_hook(hook_sums)
    assert not summed and "step 1" in summed.message and "shards of the mean gradient" in summed.hint, summed.line()
    refused = Z.zero2_bucket_hook(hook_calls_labkit)
    assert not refused and "ZeRO2._shard_grads is disabled" in refused.message, refused.line()

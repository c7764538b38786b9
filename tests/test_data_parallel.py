"""Data parallelism (labkit/data_parallel.py): naive and bucketed DDP, gradient accumulation.

Tier 1 (no processes): buckets in reverse forward order, sizes, the factory's choice.
Tier 2 (gloo ranks, DP 1, 2, 4; with and without accumulation): parameters after each of 5
AdamW steps, losses and grad norms equal single-device training (tests/dp_parity.py; fp32,
tolerances there); all-reduce bytes per step equal labkit.calc's ring formula exactly, once per
step whatever the number of microbatches (no_sync); bucketed all-reduces start during the
backward, naive ones after it (event order, not timing); labkit.train with each flag
(ddp_bucket_size, use_distributed_optimizer, zero_stage 2/3) equals the reference loss by loss;
bucketed DDP composes with PP 2 x DP 2 (float64); the lab's bucket-hook check fails a hook that
forgets / dp; bad configurations raise ValueError before any process starts.
GPU (marked, skipped on CPU): every variant on NCCL, 2 GPUs, with the step times printed.
"""
import pytest
import torch

import labkit
from labkit.calc.comm import dp_step_bytes
from labkit.config import TrainConfig
from labkit.data_parallel.ddp import BucketedDataParallel, NaiveDataParallel, make_buckets
from labkit.data_parallel.wrap import wrap_data_parallel
from labkit.measure.dp import overlap_worker
from labkit.reference import train_reference

import dp_parity

NAMES = ("naive", "bucketed")


@pytest.fixture(scope="module")
def ref():
    return dp_parity.reference()


@pytest.mark.parametrize("dp", [1, 2, 4])
def test_parity_and_bytes(ref, dp):
    results = dp_parity.run(NAMES, dp)
    num_params = sum(p.numel() for p in ref["params"][0].values())
    for name in results[0]:
        dp_parity.check_parity(results, ref, name)
        expected = dp_step_bytes(num_params * 4, dp, zero_stage=0)
        for r, res in enumerate(results):
            for k, step in enumerate(res[name]["comm"]):
                got = {op: v["bytes"] for op, v in step.items()}
                assert got == ({} if dp == 1 else expected), f"{name} rank {r} step {k + 1}: {got} != {expected}"
        if name.startswith("bucketed") and dp > 1:  # one all-reduce per bucket per step, even with accumulation
            calls = results[0][name]["comm"][0]["all_reduce"]["calls"]
            buckets = make_buckets(list(ref["params"][0].values()), 4096, None)
            assert calls == len(buckets), f"{name}: {calls} all-reduces per step, {len(buckets)} buckets"


def test_buckets_reverse_order_and_size():
    params = [torch.zeros(n) for n in (10, 20, 30, 40, 5)]
    buckets = make_buckets(params, 35, None)
    assert [[p.numel() for p in b.params] for b in buckets] == [[5, 40], [30, 20], [10]]
    assert [b.numel for b in buckets] == [45, 50, 10]
    with pytest.raises(ValueError, match="bucket_size must be > 0"):
        make_buckets(params, 0, None)


def test_factory_choice():
    from labkit.data_parallel.zero import ZeRO1, ZeRO3
    from labkit.groups import Group
    g = {"dp": Group("dp", (0,), None), "cp": Group("cp", (0,), None)}

    def kinds(cfg):
        model = torch.nn.Linear(4, 4)
        return [type(m) for m in wrap_data_parallel([model], g, cfg).members]
    assert kinds(TrainConfig()) == [NaiveDataParallel]
    assert kinds(TrainConfig(ddp_bucket_size=8)) == [BucketedDataParallel]
    assert kinds(TrainConfig(use_distributed_optimizer=True)) == [ZeRO1]
    assert kinds(TrainConfig(zero_stage=3)) == [ZeRO3]


def test_overlap_event_order():
    """Bucketed: every bucket's all-reduce is launched before the backward returns (overlap);
    naive: every all-reduce starts after it. Orders of events, not durations."""
    out = labkit.launch(overlap_worker, 2, dict(num_layers=2, hidden_size=32, num_attention_heads=4,
                                                seq_length=16, micro_batch_size=2), 2000, 2)
    for r, res in enumerate(out):
        bwd_end = dict((p[0], p[2]) for p in res["bucketed"]["phases"])["backward"]
        starts = [a for _, a, _ in res["bucketed"]["all_reduce"]]
        assert len(starts) > 1 and all(a <= bwd_end for a in starts), (r, starts, bwd_end)
        bwd_end = dict((p[0], p[2]) for p in res["naive"]["phases"])["backward"]
        assert all(a >= bwd_end for _, a, _ in res["naive"]["all_reduce"])


@pytest.fixture(scope="module")
def ref_losses():
    return train_reference(steps=5, micro_batch_size=8, global_batch_size=8, **dp_parity.MODEL)


@pytest.mark.parametrize("flags", [{}, {"ddp_bucket_size": 4096}, {"use_distributed_optimizer": True},
                                   {"zero_stage": 2}, {"zero_stage": 3}], ids=str)
def test_train_losses_equal_reference(ref_losses, flags):
    """labkit.train itself (Megatron-style flags), DP 2 with 2 microbatches per rank."""
    got = labkit.train(world_size=2, steps=5, micro_batch_size=2, global_batch_size=8, log_interval=0,
                       **dp_parity.MODEL, **flags)
    torch.testing.assert_close(torch.tensor(got.losses), torch.tensor(ref_losses), rtol=1e-5, atol=2e-6)
    stage = flags.get("zero_stage", 1 if flags.get("use_distributed_optimizer") else 0)
    held = got.ranks[0]["memory"]  # result.ranks[r]["memory"]: what the rank held at its last sync
    # AdamW's 8 B/param vs the 4 B/param of weights: 2x, unless the moments are sharded over the
    # 2 ranks and the weights are not (ZeRO-1/2: 1x); ZeRO-3 shards both (2x again)
    assert held["optimizer"] == {0: 2, 1: 1, 2: 1, 3: 2}[stage] * held["params"], held


@pytest.mark.parametrize("kw, rule", [
    (dict(world_size=4, tensor_model_parallel_size=3), "divisible"),            # dp does not divide the world
    (dict(world_size=2, micro_batch_size=2, global_batch_size=6), r"global_batch_size divisible by "
                                                                   r"micro_batch_size \* DP; 6 % \(2 \* 2\)"),
    (dict(world_size=2, ddp_bucket_size=0), "ddp_bucket_size must be a positive"),
    (dict(world_size=2, ddp_bucket_size=-5), "ddp_bucket_size must be a positive"),
    (dict(world_size=2, zero_stage=4), "zero_stage must be 0, 1, 2 or 3"),
    (dict(world_size=2, zero_stage=2, ddp_bucket_size=100), "applies to zero_stage 0 only"),
    (dict(world_size=4, zero_stage=3, pipeline_model_parallel_size=2, num_layers=4),
     "zero_stage 3 with pipeline_model_parallel_size 2"),
])
def test_bad_input_raises_before_launch(kw, rule, monkeypatch):
    import labkit.launcher
    monkeypatch.setattr(labkit.launcher, "launch", lambda *a, **k: pytest.fail("a process was started"))
    with pytest.raises(ValueError, match=rule):
        labkit.train(steps=1, **kw)


def test_bucketed_composes_with_pipeline():
    """Bucketed DDP under PP 2 x DP 2: the pipeline wraps each backward in
    grad_sync_context; float64, so losses equal the reference to 1e-12."""
    cfg = dict(num_layers=4, hidden_size=32, num_attention_heads=4, seq_length=16, micro_batch_size=2,
               global_batch_size=8, params_dtype="float64")
    expected = train_reference(steps=3, **cfg)
    for extra in ({},):  # interleaved (num_layers_per_virtual_pipeline_stage=1) also passes: 9e-16
        got = labkit.train(world_size=4, steps=3, log_interval=0, pipeline_model_parallel_size=2,
                           ddp_bucket_size=500, **cfg, **extra)
        torch.testing.assert_close(torch.tensor(got.losses), torch.tensor(expected), rtol=1e-12, atol=1e-12)


@pytest.mark.gpu(devices=2)
@pytest.mark.parametrize("variant", ["naive", "bucketed", "zero1", "zero2", "zero3"])
def test_nccl_parity_and_weak_scaling(variant):
    """On a GPU node (NCCL, one rank per GPU): every variant's losses equal the reference, and DP 2
    runs twice the global batch; the step times are printed (weak scaling), never asserted."""
    from labkit.measure.dp import VARIANTS
    kw = dict(dp_parity.MODEL, global_batch_size=8, **VARIANTS[variant])
    expected = train_reference(steps=5, micro_batch_size=8, **{k: v for k, v in kw.items()
                                                              if k not in ("ddp_bucket_size", "zero_stage")})
    got = labkit.train(world_size=2, steps=5, micro_batch_size=2, backend="nccl", log_interval=0, **kw)
    torch.testing.assert_close(torch.tensor(got.losses), torch.tensor(expected), rtol=1e-4, atol=1e-5)
    print(variant, "DP 2 step ms", [round(t, 1) for t in got.iteration_ms])


def test_check_bucket_hook_catches_missing_average(capsys):
    """The lab's check fails a hook that forgets / dp, and says the gradients are dp x the mean
    (its passing path, with the reference hook, runs in labs/data-parallel-lab.ipynb)."""
    from labkit.check import data_parallel as check
    from labkit.data_parallel.ddp import all_reduce_async

    def summing_hook(bucket, param):
        bucket.ready.add(id(param))
        if len(bucket.ready) == len(bucket.params):
            bucket.buffer = torch.cat([p.grad.reshape(-1) for p in bucket.params])  # no / dp
            bucket.work = all_reduce_async(bucket.group, bucket.buffer)

    result = check.bucket_hook(summing_hook)
    assert not result and "2x the mean" in result.hint, result.line()

"""ZeRO-1/2/3 (labkit/data_parallel/zero.py on shard_layout.py): parity, bytes and memory.

Tier 1 (no processes): the shard layout (ranges, padding = calc's ceil(P/dp) rule, views that
write through), distinct-storage byte counting, ZeRO-3 refusing to run without its module.
Tier 2 (gloo ranks):
* Parity, DP 1, 2, 4, each stage with and without gradient accumulation: parameters after each of
  5 AdamW steps, losses and grad norms equal single-device training (tests/dp_parity.py, fp32).
* Bytes per rank per step equal labkit.calc.comm.dp_step_bytes exactly with one microbatch; with m
  microbatches stage 2 reduce-scatters m times and stage 3 also all-gathers 2m times (per-op
  counts from the same calc formulas).
* Memory held per rank, DP 1/2/4/8 x ZeRO 0-3, equals labkit.calc.memory.zero_memory_per_rank.
* Gradient clipping on shards (float64) follows the clipped single-device run; the lab's ZeRO-1
  check fails a step that forgets the all-gather.
"""
import pytest
import torch

import labkit
from labkit.calc.comm import dp_step_bytes
from labkit.calc.memory import zero_memory_per_rank
from labkit.data_parallel.shard_layout import ShardLayout, storage_bytes
from labkit.measure.dp import memory_worker

import dp_parity

NAMES = ("zero1", "zero2", "zero3")


@pytest.fixture(scope="module")
def ref():
    return dp_parity.reference()


def expected_bytes(num_params: int, dp: int, stage: int, m: int) -> dict:
    return {} if dp == 1 else dp_step_bytes(num_params * 4, dp, zero_stage=stage, num_microbatches=m)


@pytest.mark.parametrize("dp", [1, 2, 4])
def test_parity_and_bytes(ref, dp):
    results = dp_parity.run(NAMES, dp)
    num_params = sum(p.numel() for p in ref["params"][0].values())
    for name in results[0]:
        dp_parity.check_parity(results, ref, name)
        stage, m = int(name[4]), results[0][name]["num_microbatches"]
        assert m == (2 if name.endswith("+accum") else 1)
        expected = expected_bytes(num_params, dp, stage, m)
        for r, res in enumerate(results):
            for k, step in enumerate(res[name]["comm"]):
                got = {op: v["bytes"] for op, v in step.items()}
                assert got == expected, f"{name} rank {r} step {k + 1}: {got} != {expected}"


@pytest.mark.parametrize("dp", [1, 2, 4, 8])
def test_memory_equals_calc(dp):
    base = dict(num_layers=1, hidden_size=32, num_attention_heads=4, seq_length=16, micro_batch_size=1,
                global_batch_size=dp)
    out = labkit.launch(memory_worker, dp, (0, 1, 2, 3), base)
    for r, res in enumerate(out):
        for stage, held in res.items():
            expected = zero_memory_per_rank(held["num_params"], dp, stage)
            got = {k: held[k] for k in ("params", "grads", "optimizer")}
            assert got == expected, f"dp {dp} rank {r} ZeRO-{stage}: held {got}, calc {expected}"


def test_shard_layout():
    layout = ShardLayout([5, 3, 4], dp=5)                      # P = 12 -> S = ceil(12/5) = 3, padded 15
    assert (layout.numel, layout.shard_numel, layout.padded_numel) == (12, 3, 15)
    assert [layout.shard_range(r) for r in range(5)] == [(0, 3), (3, 6), (6, 9), (9, 12), (12, 15)]
    ts = [torch.arange(5.0), torch.arange(3.0) + 10, torch.arange(4.0).view(2, 2) + 20]
    flat = layout.flatten(ts)
    assert flat.tolist() == [0, 1, 2, 3, 4, 10, 11, 12, 20, 21, 22, 23, 0, 0, 0]
    views = layout.views(flat, [t.shape for t in ts])
    views[2][1, 0] = -1.0                                      # a view writes through to the buffer
    assert flat[10] == -1.0 and all(torch.equal(v, t) for v, t in zip(views[:2], ts[:2]))
    params = [torch.nn.Parameter(t.clone()) for t in ts]
    buf = torch.zeros(15)
    layout.bind(params, buf)
    assert buf[:12].tolist() == torch.cat([t.reshape(-1) for t in ts]).tolist()
    assert storage_bytes(params) == 15 * 4                      # one storage, counted once
    with pytest.raises(ValueError):
        ShardLayout([4], dp=0)


def test_storage_bytes_freed_storage_counts_zero():
    t = torch.zeros(100)
    v = t[10:20]
    assert storage_bytes([t, v, None]) == 400
    t.untyped_storage().resize_(0)
    assert storage_bytes([t, v]) == 0


def test_zero3_needs_module():
    from labkit.config import TrainConfig
    from labkit.data_parallel.zero import ZeRO3
    from labkit.groups import Group
    with pytest.raises(ValueError, match="ZeRO-3 needs the module"):
        ZeRO3(list(torch.nn.Linear(2, 2).named_parameters()), Group("dp", (0,), None), TrainConfig())


def test_gradient_clipping_on_shards():
    """clip_grad: the Engine's global norm sums the shards' squares over dp, and the shards are
    scaled; losses follow the clipped single-device run (the norm, ~1.7, is far above 0.05).
    float64: AdamW hides most of a gradient's scale, so clipping moves the losses by only ~1e-5;
    parity holds to 1e-12, far below that."""
    from labkit.reference import train_reference
    cfg = dict(num_layers=1, hidden_size=32, num_attention_heads=4, seq_length=16, global_batch_size=8,
               clip_grad=0.05, params_dtype="float64")
    expected = train_reference(steps=4, micro_batch_size=8, **cfg)
    got = labkit.train(world_size=2, steps=4, micro_batch_size=2, zero_stage=2, log_interval=0, **cfg)
    torch.testing.assert_close(torch.tensor(got.losses), torch.tensor(expected), rtol=1e-12, atol=1e-12)
    unclipped = train_reference(steps=4, micro_batch_size=8, **dict(cfg, clip_grad=0.0))
    assert max(abs(a - b) for a, b in zip(unclipped, expected)) > 1e-8  # clipping did change training


def test_check_zero1_step_catches_missing_all_gather():
    """The lab's check fails a ZeRO-1 step that never all-gathers: other ranks' shards are stale."""
    from labkit import comm
    from labkit.check import data_parallel as check

    def no_gather(group, flat_params, flat_grads, shard, optimizer):
        shard.grad = comm.reduce_scatter(group, flat_grads) / group.size
        optimizer.step()

    result = check.zero1_step(no_gather, world_size=2)
    assert not result and "all-gather" in result.hint, result.line()

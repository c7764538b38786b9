"""Tier 1 (no processes): the pipeline's p2p steps are NCCL-safe for every schedule, proven.

labkit.pipeline_parallel.p2p_plan batches a schedule's sends and receives the way Megatron-LM does
and checks them under rendezvous semantics (a send completes only while its receive is posted:
what NCCL does for large messages). The checks must also be able to fail: the unbatched pattern
that hangs on NCCL, and a batching that is wrong for the interleaved schedule, are rejected.
"""
import itertools

import pytest

from labkit.pipeline_parallel import schedules as S
from labkit.pipeline_parallel.p2p_plan import (Message, Step, check, interleaved_ticks, per_action_ticks,
                                               plan, rank_steps)


def schedules_grid():
    for p, m in itertools.product(range(2, 9), range(1, 17)):
        yield f"gpipe p{p} m{m}", S.gpipe(p, m)
        yield f"1f1b p{p} m{m}", S.one_f_one_b(p, m)
        yield f"zb_h1 p{p} m{m}", S.zb_h1(p, m)
        for v in (2, 3, 4):
            if m % p == 0:
                yield f"interleaved p{p} v{v} m{m}", S.interleaved(p, v, m)


def test_every_schedule_has_a_safe_plan():
    n = 0
    for name, sched in schedules_grid():
        steps = plan(sched)
        sent = sum(len(st.sends) for rs in steps for st in rs)
        recvd = sum(len(st.recvs) for rs in steps for st in rs)
        p, v, m = len(sched), 1 + max(a.chunk for a in sched[0]), 1 + max(a.microbatch for a in sched[0])
        assert sent == recvd == 2 * m * (p * v - 1), name   # one activation + one gradient per boundary
        n += 1
    assert n > 400


def test_megatron_batching_per_schedule():
    """1F1B uses the per-action batching (send_forward_recv_backward ...); interleaved with m > p
    needs the steady-state pairs (send_forward_backward_recv_forward_backward)."""
    assert plan(S.one_f_one_b(4, 8))[1] == rank_steps(S.one_f_one_b(4, 8)[1], 1, 4, 1, per_action_ticks)
    sched = S.interleaved(2, 2, 4)
    assert plan(sched)[0] == rank_steps(sched[0], 0, 2, 2, interleaved_ticks)


def test_per_action_batching_of_interleaved_deadlocks():
    sched = S.interleaved(2, 2, 4)
    steps = [rank_steps(acts, r, 2, 2, per_action_ticks) for r, acts in enumerate(sched)]
    with pytest.raises(ValueError, match="p2p deadlock"):
        check(steps)


def test_unbatched_sends_in_both_directions_deadlock():
    """Issue 15, defect 1: every send and every receive its own operation, as unbatched
    isend/recv on one NCCL stream per pair. 1F1B's steady state then waits in a cycle."""
    sched = S.one_f_one_b(2, 4)
    unbatched = []
    for r, acts in enumerate(sched):
        ops = []
        for st in rank_steps(acts, r, 2, 1):
            ops += [Step(sends=[s]) for s in st.sends] + [Step(recvs=[q]) for q in st.recvs]
        unbatched.append(ops)
    with pytest.raises(ValueError, match="p2p deadlock"):
        check(unbatched)


def test_order_mismatch_is_reported():
    steps = plan(S.one_f_one_b(2, 4))
    rank1 = [st for st in steps[1] if st.recvs]
    rank1[0].recvs, rank1[1].recvs = rank1[1].recvs, rank1[0].recvs   # receive mb 1 before mb 0
    with pytest.raises(ValueError, match="p2p order mismatch from rank 0 to rank 1"):
        check(steps)


def test_message_names():
    assert str(Message("F", 3, 1)) == "activation into stage 3, mb 1"
    assert str(Message("B", 0, 2)) == "gradient of stage 0, mb 2"


def _record_exchanges(schedule_name: str):
    """Run one PP step on this rank, recording every p2p call the executor makes."""
    import torch.distributed as dist

    from labkit import comm, data
    from labkit.config import TrainConfig
    from labkit.training import build_rank, rank_microbatches
    cfg = TrainConfig(num_layers=4, hidden_size=32, num_attention_heads=4, seq_length=16, micro_batch_size=1,
                      global_batch_size=4, pipeline_model_parallel_size=2,
                      num_layers_per_virtual_pipeline_stage=1 if schedule_name == "interleaved" else None)
    topo, groups, engine = build_rank(cfg, 0)
    calls, real = [], comm.exchange

    def recording(group, sends=(), recvs=(), device=None):
        calls.append(([(dst, tuple(name)) for _, dst, name in sends], [(src, tuple(name)) for src, name, *_ in recvs]))
        return real(group, sends, recvs, device)

    def unbatched(*args, **kwargs):
        raise AssertionError("an unbatched p2p call: NCCL would pair it by order with anything")
    comm.exchange = recording
    saved = {n: getattr(dist, n) for n in ("send", "recv")}   # blocking, unbatched: never used
    for n in saved:
        setattr(dist, n, unbatched)
    try:
        engine.step(rank_microbatches(cfg, topo, 0, 0, data.load_tokens()))
    finally:
        comm.exchange = real
        for n, f in saved.items():
            setattr(dist, n, f)
    return calls


@pytest.mark.parametrize("name", ["1f1b", "interleaved"])
def test_the_executor_runs_exactly_the_planned_batches(name):
    """Tier 2: the pipeline's p2p calls are the plan's steps, in order, each one batch."""
    import labkit
    from labkit.pipeline_parallel.executor import _meta
    sched = S.one_f_one_b(2, 4) if name == "1f1b" else S.interleaved(2, 2, 4)
    planned = plan(sched)
    for r, calls in enumerate(labkit.launch(_record_exchanges, 2, name)):
        expected = [([(q, _meta(m)) for q, m in st.sends], [(q, _meta(m)) for q, m in st.recvs])
                    for st in planned[r]]
        assert calls == expected, f"rank {r}"

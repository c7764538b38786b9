"""Tier 2 (gloo ranks): pipeline and interleaved pipeline parallelism against the dense GPT.

* labkit.train with PP 2 and 4, with and without interleaving (v = 2), alone and with DP 2:
  losses over 5 steps equal the single-device loop's (labkit.reference, an independent path).
* Every stage's gradients equal the dense model's, for GPipe, 1F1B, interleaved and ZB-H1; the
  tied word embeddings' two copies (first and last stage) both carry the dense gradient.
* What the executor measures: one event per action in schedule order, activations held per
  rank = the schedule's in-flight count x bytes per microbatch, p2p bytes = the messages the
  schedule implies.
* Bad configurations raise ValueError before any process starts.
float64 on CPU: the pipeline only reorders sums over microbatches, so tolerances are ~1e-12.
"""
import pytest
import torch

import labkit
from labkit import data
from labkit.measure.pipeline import measure
from labkit.model import GPT, GPTConfig
from labkit.pipeline_parallel import schedules as S
from labkit.pipeline_parallel.placement import stage_of
from labkit.pipeline_parallel.simulate import simulate, validate
from labkit.reference import train_reference

F64 = dict(rtol=1e-12, atol=1e-12)  # float64: only the order of additions differs
COMMON = dict(hidden_size=32, num_attention_heads=4, seq_length=16, micro_batch_size=2,
              global_batch_size=8, params_dtype="float64")


@pytest.fixture(scope="module")
def reference_losses():
    return train_reference(steps=5, num_layers=8, **COMMON)


@pytest.mark.parametrize("world,pp,per_virtual", [
    (2, 2, None),    # PP 2
    (4, 4, None),    # PP 4
    (2, 2, 2),       # PP 2, interleaved v = 2
    (4, 4, 1),       # PP 4, interleaved v = 2
    (4, 2, None),    # PP 2 x DP 2
    (4, 2, 2),       # PP 2 x DP 2, interleaved v = 2
])
def test_train_losses_equal_single_device(world, pp, per_virtual, reference_losses):
    res = labkit.train(world_size=world, steps=5, log_interval=0, num_layers=8,
                       pipeline_model_parallel_size=pp,
                       num_layers_per_virtual_pipeline_stage=per_virtual, **COMMON)
    torch.testing.assert_close(torch.tensor(res.losses), torch.tensor(reference_losses), **F64)


def dense_grads(num_layers, m, micro_batch_size=2, seq_length=16, hidden_size=32):
    """Gradients of the dense GPT on iteration 0's global batch: one forward, one backward."""
    cfg = GPTConfig(num_layers=num_layers, hidden_size=hidden_size, num_attention_heads=4,
                    seq_length=seq_length)
    model = GPT(cfg, seed=0).double()
    inputs, labels = data.get_batch(data.load_tokens(), 0, m * micro_batch_size, seq_length, 0)
    loss = model.loss(inputs, labels)
    loss.backward()
    return loss.item(), {n: p.grad for n, p in model.named_parameters()}


SCHEDULES = {
    "gpipe p2 m4": (S.gpipe(2, 4), 4),
    "1f1b p2 m4": (S.one_f_one_b(2, 4), 4),
    "1f1b p4 m4": (S.one_f_one_b(4, 4), 4),
    "interleaved p2 v2 m4": (S.interleaved(2, 2, 4), 4),
    "interleaved p4 v2 m4": (S.interleaved(4, 2, 4), 8),
    "zb-h1 p2 m4": (S.zb_h1(2, 4), 4),
    "zb-h1 p4 m4": (S.zb_h1(4, 4), 4),
}


@pytest.fixture(scope="module", params=sorted(SCHEDULES))
def measured(request):
    sched, layers = SCHEDULES[request.param]
    run = measure(sched, num_layers=layers, hidden_size=32, seq_length=16, micro_batch_size=2,
                  iterations=1, return_grads=True, params_dtype="float64")
    return sched, layers, run


def test_stage_gradients_equal_dense(measured):
    sched, layers, run = measured
    p, v, m = validate(sched)
    loss, ref = dense_grads(layers, m)
    assert run.losses[0] == pytest.approx(loss, rel=1e-12)
    seen = set()
    for rank_grads in run.grads:
        for name, grad in rank_grads.items():
            torch.testing.assert_close(grad, ref[name], **F64, msg=name)
            seen.add(name)
    assert seen == set(ref)  # every parameter lives on some stage
    tied = [g for rg in run.grads for n, g in rg.items() if n.startswith("embedding.word")]
    assert len(tied) == 2  # first-stage embeddings and last-stage copy, both all-reduced


def test_events_follow_the_schedule(measured):
    """Each rank ran its list in order, one action at a time, and (one clock for all ranks, the
    time origin shared by measure) no stage started a microbatch before the stage that feeds it
    had finished it: F on stage s after F on s - 1, B on stage s after B on s + 1, W after its B.
    The order alone is what the executor's loop records; the times across ranks are what its p2p
    must make true (a stage that computed on an input it had not received would break them)."""
    sched, _, run = measured
    p, v, m = validate(sched)
    for r, acts in enumerate(sched):
        mine = sorted((e for e in run.events if e.rank == r), key=lambda e: e.start)
        assert [e.action for e in mine] == acts
        assert all(a.start <= a.end <= b.start for a, b in zip(mine, mine[1:]))
    done = {(e.action.kind, stage_of(e.rank, e.action.chunk, p, v), e.action.microbatch): e.end
            for e in run.events}
    for e in run.events:
        kind, s, mb = e.action.kind, stage_of(e.rank, e.action.chunk, p, v), e.action.microbatch
        feeder = {"F": ("F", s - 1, mb), "B": ("B", s + 1, mb), "W": ("B", s, mb)}[kind]
        if feeder in done:                                  # not the first stage's F, the last's B
            assert e.start >= done[feeder], (e, feeder, done[feeder])


def test_activation_memory_follows_the_schedule(measured):
    sched, _, run = measured
    sim = simulate(sched)
    assert run.peak_in_flight == sim.peak_in_flight
    p, v, m = validate(sched)
    if v == 1:  # every microbatch saves the same bytes on a rank: peak = in-flight x that
        for r in range(p):
            assert run.peak_activation_bytes[r] == sim.peak_in_flight[r] * run.activation_bytes[r][0]


def test_p2p_bytes_are_the_schedules_messages(measured):
    sched, _, run = measured
    p, v, m = validate(sched)
    act = 2 * 16 * 32 * 8  # [b, s, h] float64, the same for activations and their gradients
    for r in range(p):
        stages = [c * p + r for c in range(v)]
        msgs = sum(m * ((s < p * v - 1) + (s > 0)) for s in stages)
        assert run.p2p_bytes[r] == msgs * act


def test_gpipe_holds_m_and_1f1b_at_most_p():
    g, o = (simulate(s).peak_in_flight for s in (S.gpipe(4, 8), S.one_f_one_b(4, 8)))
    assert g == [8] * 4 and o == [4, 3, 2, 1]


# --- bad input: ValueError before any process starts ----------------------------------------
@pytest.mark.parametrize("world,kw,err", [
    (2, dict(pipeline_model_parallel_size=4), r"world_size divisible by TP\*PP\*CP; 2 is not divisible"),
    (2, dict(pipeline_model_parallel_size=2, num_layers=3), "num_layers divisible by PP; 3 % 2"),
    (2, dict(pipeline_model_parallel_size=2, num_layers=4, num_layers_per_virtual_pipeline_stage=3),
     "layers per virtual stage; 2 % 3"),
    (2, dict(pipeline_model_parallel_size=2, num_layers=4, num_layers_per_virtual_pipeline_stage=1,
             micro_batch_size=2, global_batch_size=6), "num_microbatches divisible by PP; 3 % 2"),
])
def test_bad_pipeline_config_raises_before_launch(world, kw, err, monkeypatch):
    import labkit.launcher
    monkeypatch.setattr(labkit.launcher, "launch", lambda *a, **k: pytest.fail("launched"))
    with pytest.raises(ValueError, match=err):
        labkit.train(world_size=world, steps=1, **kw)


def test_measure_rejects_bad_layers():
    with pytest.raises(ValueError, match="num_layers 3 is not divisible"):
        measure(S.one_f_one_b(2, 2), num_layers=3)

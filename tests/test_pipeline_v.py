"""A V-shaped pipeline schedule (GPipe's order on the V placement, ``pipeline_schedule="gpipe_v"``).

Issue 35, "Placement answers for its consequences". Under the V (v = 2) rank r holds stages r and
2p-1-r: the turn of the V (stage p-1 to stage p) stays on rank p-1, and rank 0 holds both ends, so
a tied output layer reads rank 0's own word embeddings (no copy, no embedding all-reduce).

Tier 1 (no processes): the placement's answers (local hand-offs, end ranks, the embedding group);
the p2p plan sends no message to oneself and refuses a rank that uses a local hand-off before it
makes it; calc's per-rank parameters and layers equal what ``stage.split`` really builds, on the
loop and the V; rank 0's last chunk borrows the tied weight (not its parameter, but used); a
``schedule_fn`` runs on the chunks' placement; labkit.debug's embedding-sum bug asks the placement.
Tier 2 (gloo ranks, ``labkit.train`` with a launch timeout, so a hang fails instead of waiting):
PP 2 and 4, tied and untied, m = 4 microbatches, and PP 2 x DP 2 and PP 2 x TP 2 train like one
device (``labkit.reference``, float64): losses and gradient norms of 3 steps, every gradient after
step 1 (the tied weight's gradient is both uses' sum, once); the p2p bytes each rank sent are the
schedule's cross-rank messages only (``labkit.calc.labkit_step_bytes`` agrees) and the embedding
group moves nothing; a checkpoint saved under the V loads under the loop and back, and the run
continues like one device.
"""
from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

import labkit
from labkit import calc
from labkit.calc.composed import labkit_step_bytes
from labkit.config import TrainConfig
from labkit.pipeline_parallel import placement as pl
from labkit.pipeline_parallel import schedules as S
from labkit.pipeline_parallel.p2p_plan import plan
from labkit.pipeline_parallel.simulate import simulate, validate
from labkit.reference import train_reference
from labkit.topology import Topology

MODEL = dict(hidden_size=32, num_attention_heads=4, seq_length=16, micro_batch_size=2, global_batch_size=8,
             params_dtype="float64")
F64 = dict(rtol=1e-12, atol=1e-12)     # float64: only the order of additions differs
STEPS = 3


def v_config(pp: int, **kw) -> dict:
    """gpipe_v over pp ranks: 2 chunks of one layer each per rank (num_layers = 2 pp)."""
    return dict(MODEL, num_layers=2 * pp, pipeline_model_parallel_size=pp,
                num_layers_per_virtual_pipeline_stage=1, pipeline_schedule="gpipe_v", **kw)


# -- tier 1: the placement's answers ------------------------------------------------------------
@pytest.mark.parametrize("p", [2, 3, 4])
def test_v_placement_answers_for_its_consequences(p):
    assert pl.local_handoffs(p, 2, "v") == [p - 1]              # the turn of the V, on rank p-1
    assert pl.local_handoffs(p, 2, "loop") == []                 # the loop crosses ranks every time
    assert pl.end_ranks(p, 2, "v") == (0, 0) and pl.end_ranks(p, 2, "loop") == (0, p - 1)
    assert pl.embedding_ranks(p, 2, "v") == [0] and pl.embedding_ranks(p, 2, "loop") == [0, p - 1]
    assert [pl.holds_ends(r, p, 2, "v") for r in range(p)] == [(True, True)] + [(False, False)] * (p - 1)
    assert pl.rank_layers(4 * p, p - 1, p, 2, "v") == [2 * (p - 1), 2 * p - 1, 2 * p, 2 * p + 1]


def test_embedding_group_of_the_v_is_one_rank():
    cfg = TrainConfig(**v_config(2))
    assert cfg.embedding_ranks() == [0]
    assert TrainConfig(**dict(v_config(2), pipeline_schedule=None)).embedding_ranks() == [0, 1]
    topo = Topology(4, pp=2)                                     # pp groups [0, 2] and [1, 3] (dp 2)
    assert topo.embedding_groups(cfg.embedding_ranks()) == [[0], [1]]
    assert topo.embedding_groups() == [[0, 2], [1, 3]]           # the loop: first and last


def test_the_planted_embedding_sum_bug_acts_only_where_the_tie_crosses_ranks():
    """labkit.debug's "vpp_embedding_grad_not_summed" drops the embedding group's sum: under the V
    there is none to drop (one rank holds both ends), so its condition asks the placement."""
    from labkit.debug.composition import WHEN
    when = WHEN["vpp_embedding_grad_not_summed"]
    v, loop = TrainConfig(**v_config(2)), TrainConfig(**dict(v_config(2), pipeline_schedule=None))
    assert not when(v, v.topology(2)) and when(loop, loop.topology(2))


@pytest.mark.parametrize("p, m", [(2, 1), (2, 4), (4, 3), (4, 8)])
def test_gpipe_v_is_valid_and_sends_no_message_to_itself(p, m):
    sched = S.build("gpipe_v", p, 2, m)
    assert validate(sched, placement="v") == (p, 2, m)
    assert simulate(sched, placement="v").peak_in_flight == [2 * m] * p   # GPipe: every mb, both chunks
    steps = plan(sched, "v")
    for r, rs in enumerate(steps):
        peers = [q for st in rs for q, _ in st.sends + st.recvs]
        assert r not in peers, f"rank {r} messages itself"
        sends = sum(len(st.sends) for st in rs)
        cross = sum(m * ((s < 2 * p - 1 and not pl.hands_off_locally(s, p, 2, "v"))
                         + (s > 0 and not pl.hands_off_locally(s - 1, p, 2, "v")))
                    for s in pl.rank_stages(r, p, 2, "v"))
        assert sends == cross == (2 * m if r in (0, p - 1) else 4 * m)   # the ends: one hand-off local


def test_plan_refuses_a_local_hand_off_used_before_it_is_made():
    sched = S.gpipe_v(2, 2)
    bad = [list(acts) for acts in sched]
    i, j = bad[1].index(S.F(0)), bad[1].index(S.F(0, 1))        # rank 1: stage 2 before stage 1
    bad[1][i], bad[1][j] = bad[1][j], bad[1][i]
    with pytest.raises(ValueError, match="takes over locally"):
        plan(bad, "v")


def test_a_schedule_must_match_the_chunks_and_the_names_fail_closed():
    with pytest.raises(ValueError, match="runs 2 model chunks per rank"):
        TrainConfig(**dict(v_config(2), num_layers_per_virtual_pipeline_stage=None)).validate(2)
    with pytest.raises(ValueError, match="pipeline_schedule must be one of"):
        calc.ParallelConfig(world_size=2, pipeline_model_parallel_size=2, pipeline_schedule="v")


@pytest.mark.parametrize("pp, schedule", [(2, "gpipe_v"), (4, "gpipe_v"), (2, None), (4, None)])
@pytest.mark.parametrize("untied", [False, True])
def test_calc_parameters_per_rank_are_what_each_rank_holds(pp, schedule, untied):
    """calc.stage_params (so preflight's memory) against the parameters of the chunks stage.split
    builds for each pipeline rank (distinct tensors: a borrowed tied weight is not held twice)."""
    from labkit.calc.params import stage_layers, stage_params
    from labkit.model import GPT
    from labkit.pipeline_parallel.stage import split
    cfg = TrainConfig(**dict(v_config(pp, untie_embeddings_and_output_weights=untied), pipeline_schedule=schedule))
    model_c, par = cfg.megatron_view(pp)
    for r in range(pp):
        chunks = split(GPT(cfg.model_config(), seed=0).double(), cfg, r)
        held = {id(t): t.numel() for c in chunks for t in c.parameters()}
        want = stage_params(model_c, par, r)
        assert sum(held.values()) == want["dense"] + want["expert"], f"pp rank {r}"
        assert sorted(int(k) for c in chunks for k in c.decoder.layers) == stage_layers(model_c, par, r)


def test_calc_memory_of_gpipe_v_holds_every_microbatch():
    from labkit.calc.memory import in_flight_microbatches
    model_c, par = TrainConfig(**v_config(4)).megatron_view(4)
    assert [in_flight_microbatches(model_c, par, r) for r in range(4)] == [4.0] * 4   # m = 8 / 2


# -- tier 2: training parity on gloo ranks ------------------------------------------------------
LAYOUTS = {   # name: (world size, config)
    "pp2 tied": (2, v_config(2)),
    "pp2 untied": (2, v_config(2, untie_embeddings_and_output_weights=True)),
    "pp4 tied": (4, v_config(4)),
    "pp4 untied": (4, v_config(4, untie_embeddings_and_output_weights=True)),
    "pp2 dp2 tied": (4, v_config(2)),
    "pp2 tp2 sp tied": (4, v_config(2, tensor_model_parallel_size=2, sequence_parallel=True)),
}


@pytest.fixture(scope="module", params=sorted(LAYOUTS))
def trained(request):
    world, kw = LAYOUTS[request.param]
    res = labkit.train(world_size=world, steps=STEPS, log_interval=0, capture_grads=True, timeout=180, **kw)
    ref = train_reference(world_size=world, steps=STEPS, capture_grads=True, **kw)
    return request.param, world, kw, res, ref


def test_v_schedule_trains_like_one_device(trained):
    name, _, _, res, ref = trained
    assert_close(torch.tensor(res.losses), torch.tensor(ref["losses"]), rtol=0, atol=1e-11, msg=name)
    assert_close(torch.tensor(res.grad_norms), torch.tensor(ref["grad_norms"]), rtol=1e-11, atol=0, msg=name)
    assert set(res.grads) == set(ref["grads"]), name            # tied: no second copy anywhere
    for pname, g in ref["grads"].items():   # the tied weight: embedding + output uses, summed once
        assert_close(res.grads[pname], g, **F64, msg=lambda m: f"{name}, {pname}: {m}")


def test_the_turn_of_the_v_is_no_message_and_the_tie_no_all_reduce(trained):
    name, world, kw, res, _ = trained
    cfg = TrainConfig(**kw)
    model_c, par = cfg.megatron_view(world)
    for r, extra in enumerate(res.ranks):
        comm, pp_rank = extra["comm"], extra["coords"]["pp"]
        sent = comm["pp"].get("send", {}).get("bytes", 0.0)
        want = STEPS * labkit_step_bytes(model_c, par, pp_rank, bytes_per_element=8)["pp"]["send"]
        m, act = cfg.num_microbatches(cfg.topology(world)), 2 * 16 * 32 * 8 // (2 if "sp" in name else 1)
        # per microbatch: each end rank sends 2 tensors (rank 0: stage 0's output, the gradient into
        # stage 2p-2; rank p-1 hands one over locally each way), a middle rank 4 (both chunks, both ways)
        msgs = 2 * m if pp_rank in (0, par.pp - 1) else 4 * m
        assert sent == want == STEPS * msgs * act, f"{name}: rank {r} sent {sent} p2p bytes"
        assert not comm.get("embd", {}), f"{name}: rank {r} moved {comm.get('embd')} on the embedding group"


def test_a_checkpoint_moves_between_the_v_and_the_loop(tmp_path):
    """Save under the V (one tied matrix on rank 0), load under the loop (two copies), back again:
    the run continues exactly like one device (the shard plan knows both layouts)."""
    kw = v_config(2)
    loop = dict(kw, pipeline_schedule=None, num_layers_per_virtual_pipeline_stage=None)
    a = labkit.train(world_size=2, steps=2, log_interval=0, save=tmp_path / "v", timeout=180, **kw)
    b = labkit.train(world_size=2, steps=4, log_interval=0, load=tmp_path / "v", save=tmp_path / "loop",
                     timeout=180, **loop)
    c = labkit.train(world_size=2, steps=6, log_interval=0, load=tmp_path / "loop", timeout=180, **kw)
    ref = train_reference(world_size=2, steps=6, **kw)
    assert_close(torch.tensor(a.losses + b.losses + c.losses), torch.tensor(ref), rtol=0, atol=1e-11)


def test_the_last_chunk_of_rank_0_borrows_the_tied_weight_once():
    """Under the V, rank 0's last chunk reads chunk 0's word embeddings: not among its own parameters
    (so DP, the optimizer and the norm see the matrix once), but among those its forward uses (so a
    schedule's W step, ``used_parameters``, still computes the output layer's share)."""
    from labkit.model import GPT
    from labkit.pipeline_parallel.stage import split
    cfg = TrainConfig(**v_config(2))
    chunks = split(GPT(cfg.model_config(), seed=0).double(), cfg, 0)
    word = chunks[0].embedding.word_embeddings.weight
    assert chunks[1].embedding is None and chunks[1].output_layer.weight is None
    assert all(p is not word for p in chunks[1].parameters())
    assert any(p is word for p in chunks[1].used_parameters())
    x = torch.randn(2, 16, 32, dtype=torch.float64)
    loss = chunks[1](x, torch.randint(0, 256, (2, 16)))
    (g,) = torch.autograd.grad(loss, [word])
    assert g.abs().sum() > 0                                      # the output layer's use reaches it


def test_a_schedule_function_runs_on_the_placement_the_chunks_were_cut_for():
    """A builder set as ``schedule_fn`` (as the labs do) runs on the named schedule's placement, not
    on the loop; one whose chunk count differs from what the rank holds is refused before it runs."""
    from types import SimpleNamespace

    from labkit.model import GPT
    from labkit.pipeline_parallel.executor import PipelineRunner
    from labkit.pipeline_parallel.stage import split
    cfg = TrainConfig(**v_config(2))
    chunks = split(GPT(cfg.model_config(), seed=0).double(), cfg, 1)
    runner = PipelineRunner(chunks, {"pp": SimpleNamespace(size=2, rank=1)}, schedule=cfg.schedule_name())
    runner.schedule_fn = S.gpipe_v
    actions, steps = runner.plan(4)
    assert runner.placement == "v" and actions == S.gpipe_v(2, 4)[1]
    assert all(q == 0 for st in steps for q, _ in st.sends + st.recvs)   # rank 1 talks to rank 0 only
    assert sum(len(st.sends) for st in steps) == 2 * 4                   # the turn stays local
    runner.schedule_fn = S.gpipe
    with pytest.raises(ValueError, match="uses 1 model chunk"):
        runner.plan(4)

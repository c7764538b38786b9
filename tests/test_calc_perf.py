"""The step-time model: each term on hand-checked cases, uneven pipelines, and its error on the
published runs (data/published_runs.csv) staying within what book/planning.ipynb claims."""
import pytest

import labkit.calc as c
from labkit.calc import gemm, runs
from labkit.calc.comm import dp_step_bytes
from labkit.calc.overlap import MEGATRON_2021, OverlapConfig

M18 = c.model("megatron-18b")


def _t(model=M18, cluster=None, **kw):
    over = kw.pop("overlap", c.MEGATRON_DEFAULTS)
    opts = {k: kw.pop(k) for k in ("fp8", "framework", "attention") if k in kw}
    par = c.ParallelConfig(**{"world_size": 32, "micro_batch_size": 2, "global_batch_size": 256,
                              "tensor_model_parallel_size": 8, "sequence_parallel": True, **kw})
    return c.step_time(model, par, cluster or c.cluster("dgx-a100", par.world_size // 8), overlap=over, **opts)


# ---------------------------------------------------------------------------- uneven pipelines
def test_layer_ranges_match_megatron_examples():
    # transformer_block.py's own example: 8 layers, 2 stages, 2 chunks -> [0,1][4,5] / [2,3][6,7]
    assert c.pipeline_layer_ranges(8, 2, 2) == [[(0, 2), (4, 6)], [(2, 4), (6, 8)]]
    # BLOOM-176B: 70 layers, PP 12, embedding and loss each take a slot -> 5, 6 x 10, 5
    sizes = [b - a for (a, b), in c.pipeline_layer_ranges(70, 12, account_for_embedding=True,
                                                          account_for_loss=True)]
    assert sizes == [5] + [6] * 10 + [5]
    first_last = c.pipeline_layer_ranges(10, 4, first=1, last=3)
    assert [b - a for (a, b), in first_last] == [1, 3, 3, 3]
    with pytest.raises(ValueError, match="middle"):
        c.pipeline_layer_ranges(10, 4, first=2, last=3)
    with pytest.raises(ValueError, match="cannot be combined"):
        c.pipeline_layer_ranges(10, 4, first=1, account_for_loss=True)


def test_every_layer_is_built_once():
    for L, pp, v, kw in [(126, 8, 8, dict(account_for_embedding=True, account_for_loss=True)),
                         (61, 4, 1, dict(first=13, last=16)), (96, 8, 3, {})]:
        got = [i for rank in c.pipeline_layer_ranges(L, pp, v, **kw) for a, b in rank for i in range(a, b)]
        assert sorted(got) == list(range(L))


def test_validate_names_the_argument_that_makes_it_valid():
    bloom = c.ModelConfig(70, 14336, 112, vocab_size=250880)
    with pytest.raises(ValueError, match="account_for_embedding_in_pipeline_split and account_for_loss"):
        c.validate(bloom, c.ParallelConfig(384, 4, 12))
    assert c.validate(bloom, c.ParallelConfig(384, 4, 12, account_for_embedding_in_pipeline_split=True,
                                              account_for_loss_in_pipeline_split=True)) == []
    with pytest.raises(ValueError, match="decoder_first_pipeline_num_layers=4"):
        c.validate(bloom, c.ParallelConfig(384, 4, 12))


def test_uneven_split_makes_the_heavy_stage_the_bottleneck():
    m = c.ModelConfig(30, 4096, 32, seq_length=2048, vocab_size=250880)
    even = c.ParallelConfig(32, 8, 2, micro_batch_size=1, global_batch_size=64, sequence_parallel=True)
    lighter_last = even.with_(decoder_last_pipeline_num_layers=12)   # 18 + 12: first stage is slower
    cl = c.cluster("dgx-a100", 4)
    assert c.step_time(m, lighter_last, cl)["step_time"] > c.step_time(m, even, cl)["step_time"]


# ---------------------------------------------------------------------------- terms
def test_gemm_quantization_is_one_on_full_waves_and_less_otherwise():
    assert gemm.quantization(256 * 108, 128, 64, 108) == 1.0
    assert gemm.quantization(256 * 108 + 1, 128, 64, 108) < 0.51     # one tile spills into a 2nd wave
    assert gemm.quantization(256, 128, 100, 108) == pytest.approx(1 / 108 * 100 / 128)


def test_fp8_speeds_up_gemms_only_by_the_fitted_factor():
    g = c.GPUS["H100-80GB"]
    t16 = gemm.gemm_time(8192, 8192, 8192, g, 0.7)
    t8 = gemm.gemm_time(8192, 8192, 8192, g, 0.7, fp8_speedup=1.25)
    assert t16 / t8 == pytest.approx(1.25)
    h = c.cluster("dgx-h100", 4)
    a, b = _t(cluster=h, fp8=False), _t(cluster=h, fp8=True)
    assert b["compute"] < a["compute"] and b["dp_comm"] == a["dp_comm"]


def test_dp_all_gathers_parameters_at_parameter_size():
    # ZeRO-1: reduce-scatter 4-byte grads, all-gather 2-byte params (the old model gathered at 4 B)
    sent = dp_step_bytes(2 * 100, 4, 1, grad_bytes=4 * 100)
    assert sent["all_gather"] == pytest.approx(0.5 * sent["reduce_scatter"])
    z1 = _t(zero_stage=1, use_distributed_optimizer=True)["dp_comm"]
    z0 = _t(zero_stage=0)["dp_comm"]
    assert z1 == pytest.approx(0.75 * z0, rel=1e-3)   # RS (1 G) + AG (1/2 G) vs all-reduce (2 G)


def test_overlap_flags_hide_communication():
    plain = _t(zero_stage=1, use_distributed_optimizer=True)
    both = _t(zero_stage=1, use_distributed_optimizer=True,
              overlap=OverlapConfig(overlap_grad_reduce=True, overlap_param_gather=True))
    assert both["dp_comm"] < plain["dp_comm"]
    tpo = _t(overlap=OverlapConfig(tp_comm_overlap=True))
    assert tpo["tp_comm"] < plain["tp_comm"]
    old = _t(overlap=MEGATRON_2021)   # no backward overlap: every TP collective exposed
    assert old["tp_comm"] > plain["tp_comm"]


def test_scatter_gather_p2p_divides_pipeline_bytes_by_tp_without_sp():
    base = dict(pipeline_model_parallel_size=2, world_size=64, sequence_parallel=False)
    full = _t(**base)["pp_comm"]
    sg = _t(**base, overlap=OverlapConfig(scatter_gather_p2p=True))["pp_comm"]
    assert sg < full / 4
    assert _t(**{**base, "sequence_parallel": True})["pp_comm"] == pytest.approx(sg)


def test_cp_and_ep_terms():
    long = c.model("llama3-8b").with_(seq_length=32768)
    no_cp = _t(long, tensor_model_parallel_size=1, sequence_parallel=False, global_batch_size=16,
               micro_batch_size=1, world_size=16)
    cp = _t(long, tensor_model_parallel_size=1, sequence_parallel=False, global_batch_size=16,
            micro_batch_size=1, world_size=16, context_parallel_size=4)
    slow = c.cluster("dgx-a100", 2).with_(intra_node_bandwidth=1e9)   # the CP ring inside a node
    cp_slow = _t(long, cluster=slow, tensor_model_parallel_size=1, sequence_parallel=False,
                 global_batch_size=16, micro_batch_size=1, world_size=16, context_parallel_size=4)
    no_cp_slow = _t(long, cluster=slow, tensor_model_parallel_size=1, sequence_parallel=False,
                    global_batch_size=16, micro_batch_size=1, world_size=16)
    assert cp_slow["tp_comm"] > cp["tp_comm"] == 0.0            # hidden behind attention until links are slow
    assert no_cp_slow["step_time"] == pytest.approx(no_cp["step_time"])
    moe = c.model("mixtral-8x7b")
    kw = dict(tensor_model_parallel_size=1, sequence_parallel=False, world_size=16, global_batch_size=64)
    e1 = _t(moe, **kw)
    e8 = _t(moe, expert_model_parallel_size=8, **kw)
    assert e8["tp_comm"] > e1["tp_comm"] == 0.0              # all-to-alls counted with the layer comm


def test_mfu_in_both_conventions():
    r = _t()
    m, par = M18, c.ParallelConfig(32, 8, micro_batch_size=2, global_batch_size=256)
    extra = c.attention_score_flops(m, 256)
    assert c.model_flops(m, par, "palm") == pytest.approx(c.model_flops(m, par) + extra)
    assert r["mfu_palm"] / r["mfu_causal"] == pytest.approx(c.model_flops(m, par, "palm") / c.model_flops(m, par))
    assert r["hfu_causal"] > r["mfu_causal"] or par.recompute_granularity is None


def test_planner_ranks_cp_and_uneven_layouts():
    bloomish = c.ModelConfig(70, 4096, 32, seq_length=8192, vocab_size=51200)
    result = c.plan(bloomish, c.cluster("dgx-h100", 2), 32, micro_batch_sizes=(1,), recompute=("selective",),
                    context_parallel_sizes=(1, 2))
    assert {r["cp"] for r in result["ranked"]} == {1, 2}
    assert any(r["pp"] == 4 for r in result["ranked"])        # 70 layers on 4 stages via the loss slot


# ---------------------------------------------------------------------------- the published runs
@pytest.fixture(scope="module")
def table():
    rs = runs.load_runs()
    return rs, runs.errors(rs)


def test_table_has_enough_runs_and_sources(table):
    rs, _ = table
    sources = {r["row"]["source"] for r in rs}
    assert len(rs) >= 60 and len(sources) >= 8
    assert all(r["row"]["locator"] and r["row"]["flop_convention"] for r in rs)


def test_measured_step_time_conversion_matches_the_source():
    # Narayanan 1T: 163 TFLOP/s per GPU on 3072 GPUs; BLOOM production: 105.22 s read directly
    r = next(x for x in runs.load_runs() if x["row"]["run_id"] == "narayanan2021-1T")
    f = c.paper_flops_per_iteration(r["model"], 3072, True)
    assert r["measured"] == pytest.approx(f / (163e12 * 3072))


def test_error_stays_within_what_the_chapter_claims(table):
    rs, errs = table
    fit = runs.summary([e for r, e in zip(rs, errs) if r["row"]["source"] in runs.FIT_SOURCES])
    held = runs.summary([e for r, e in zip(rs, errs) if r["row"]["source"] not in runs.FIT_SOURCES])
    every = runs.summary(errs)
    # the chapter's claims (book/planning.ipynb, "How good is it")
    assert fit["median_abs"] <= 0.05 and fit["mean_abs"] <= 0.075
    assert every["median_abs"] <= 0.065 and every["mean_abs"] <= 0.10
    assert held["median_abs"] <= 0.13 and held["mean_abs"] <= 0.20

"""The step-time model: each term on hand-checked cases, uneven pipelines, and its error on the
published runs (data/published_runs.csv) staying within what book/planning.ipynb claims."""
import pytest

import labkit.calc as c
from labkit.calc import evaluate, gemm, runs
from labkit.calc.comm import dp_step_bytes
from labkit.calc.overlap import DEEPSPEED_PIPE, MEGATRON_2021, OverlapConfig
from labkit.calc.perf import FITTED

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
    m = c.ModelConfig(30, 4096, 32, seq_length=2048, vocab_size=51200)   # logits ~ one layer's work
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
    # what FP8 does not speed up: attention stays 16-bit, the casts add memory-bound work
    m = c.model("llama3-8b")
    t = {f: gemm.layer_times(m, 1, 1, 1, g, FITTED, "flash", f) for f in (False, True)}
    assert t[True]["attn_fwd"] == t[False]["attn_fwd"] and t[True]["attn_bwd"] == t[False]["attn_bwd"]
    assert t[True]["elem_fwd"] > t[False]["elem_fwd"]
    assert t[False]["gemm_fwd"] / t[True]["gemm_fwd"] == pytest.approx(2 * FITTED.fp8_ratio, rel=0.02)


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


def test_nic_share_follows_the_group_members_per_node():
    # a ring crosses each node once: a group holding all 8 GPUs of each node (FSDP, TP 1) moves its
    # data at the node's NIC bandwidth; one member per node (TP 8 + DP) gets 1/8 of it
    cl = c.cluster("dgx-a100", 4)                              # 8 x 200 Gb/s = 200 GB/s per node
    assert cl.link(32, 32)[0] == pytest.approx(200e9)
    assert cl.link(32, 4)[0] == pytest.approx(25e9)
    assert cl.link(32, 8)[0] == pytest.approx(50e9)            # TP 4: two members per node
    assert cl.link(8)[0] == cl.intra_node_bandwidth            # inside a node: NVLink
    narrow = cl.with_(intra_node_bandwidth=100e9)              # the ring also crosses NVLink hops
    assert narrow.link(32, 32)[0] == pytest.approx(100e9)


def test_deepspeed_pipeline_waits_for_four_transfers_per_microbatch():
    base = dict(pipeline_model_parallel_size=4, world_size=32, sequence_parallel=False,
                tensor_model_parallel_size=8)
    megatron = _t(**base, overlap=OverlapConfig(async_tp_backward=False))["pp_comm"]
    deepspeed = _t(**base, overlap=DEEPSPEED_PIPE)["pp_comm"]
    assert megatron > 0 and deepspeed == pytest.approx(2 * megatron)


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
    assert no_cp_slow["tp_comm"] == no_cp["tp_comm"] == 0.0       # without CP no per-layer traffic at all
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


# ---------------------------------------------------------------------------- new terms
def test_zero3_exposes_only_what_a_layer_cannot_hide():
    # prefetch: layer l+1's gather during layer l; exposed = first gather + what exceeds compute
    from labkit.calc.perf import _fsdp_exposed
    layers = [(1.0, 2.0)] * 4                                    # forward 1 s, backward 2 s per layer
    assert _fsdp_exposed(layers, 0.5, 0.5) == pytest.approx(0.5)              # all hidden but the first
    assert _fsdp_exposed(layers, 1.5, 1.0) == pytest.approx(1.5 + 4 * 0.5 + 4 * 0.5)
    # in the step: ZeRO-3 over a slow link costs more than over a fast one, per microbatch
    m = c.model("llama3-8b")
    par = c.ParallelConfig(64, micro_batch_size=1, global_batch_size=128, zero_stage=3)
    fast = c.cluster("dgx-h100", 8)
    slow = fast.with_(inter_node_bandwidth=fast.inter_node_bandwidth / 50)
    ov = OverlapConfig(overlap_grad_reduce=True, overlap_param_gather=True)
    f, s_ = (c.step_time(m, par, cl, overlap=ov, framework="torchtitan") for cl in (fast, slow))
    assert s_["dp_comm"] > 20 * f["dp_comm"] > 0
    assert s_["compute"] == pytest.approx(f["compute"])


def test_dp_group_spanning_nodes_gets_the_nics_it_shares_and_pays_nccl_latency():
    cl = c.cluster("dgx-h100", 16)
    assert cl.group_nodes(8) == 1 and cl.group_nodes(128, 128) == 16 and cl.group_nodes(128, 16) == 16
    assert cl.group_nodes(64, 16) == 8                                     # TP 4: two members per node
    from labkit.calc.perf import collective
    n_bytes = 1e6
    within = collective("all_gather", n_bytes, 8, 450e9, 1)
    across = collective("all_gather", n_bytes, 128, cl.link(128, 128)[0], 16)
    assert across > 4 * within      # 127 ring steps, 15 of them across nodes, dominate a 1 MB gather


def test_async_tp_speedup_is_in_the_range_pytorch_published():
    # "Up to ~20% forward pass speedup and ~8% E2E speedup in Llama3 70B" (PyTorch dev-discuss,
    # "[Distributed w/ TorchTitan] Introducing Async Tensor Parallelism in PyTorch", 2024)
    m = c.model("llama3-70b").with_(seq_length=8192)
    par = c.ParallelConfig(256, 8, micro_batch_size=2, global_batch_size=64, sequence_parallel=True,
                           zero_stage=3, recompute_granularity="full")
    cl = c.cluster("dgx-h100", 32)
    base = OverlapConfig(overlap_grad_reduce=True, overlap_param_gather=True, async_tp_backward=False)
    plain = c.step_time(m, par, cl, overlap=base, framework="torchtitan")
    asy = c.step_time(m, par, cl, overlap=base.with_(tp_comm_overlap=True), framework="torchtitan")
    speedup = plain["step_time"] / asy["step_time"] - 1
    assert 0.03 < speedup < 0.15, speedup


def test_torchtitan_selective_flavours_recompute_more_than_megatrons():
    m = c.model("llama3-8b")
    par = c.ParallelConfig(8, micro_batch_size=1, global_batch_size=8, zero_stage=3, recompute_granularity="selective")
    cl = c.cluster("dgx-a100", 1)
    t = {s: c.step_time(m, par, cl, framework="torchtitan", sac=s)["compute"] for s in (None, "op", "layer")}
    assert t[None] < t["op"] < t["layer"]
    with pytest.raises(ValueError, match="sac"):
        c.step_time(m, par, cl, sac="every")


# ---------------------------------------------------------------------------- the published runs
@pytest.fixture(scope="module")
def table():
    rs = runs.load_runs()
    return rs, runs.errors(rs)


def test_table_has_enough_runs_and_sources(table):
    rs, _ = table
    sources = {r["row"]["source"] for r in rs}      # one repository or paper = one source
    assert len(rs) >= 60 and sources == set(runs.SOURCES)
    assert all(r["row"]["locator"] and r["row"]["flop_convention"] for r in rs)


def test_measured_step_time_conversion_matches_the_source():
    rs = {x["row"]["run_id"]: x for x in runs.load_runs()}
    # Narayanan 1T: 163 TFLOP/s per GPU on 3072 GPUs, converted back with the paper's Eq. 3
    r = rs["narayanan2021-1T"]
    f = c.paper_flops_per_iteration(r["model"], 3072, True)
    assert r["measured"] == pytest.approx(f / (163e12 * 3072))
    # llm-foundry 7b on 8 A100-80GB: 4641 tokens/s/GPU at global batch 96 x 2048 tokens
    assert rs["mpt-a100-80-7b-s2048-n8-mb6"]["measured"] == pytest.approx(96 * 2048 / (4641 * 8))
    # dgxc-benchmarking reads seconds per step directly (GPT-3 175B BF16, 128 GPUs: 8.91 s)
    assert rs["dgxc-gpt3-175b-bf16-n128"]["measured"] == 8.91


def test_the_held_out_set_is_the_frozen_one():
    # data/published_runs_heldout.csv was frozen (hashed, committed) before the model changed
    assert runs.heldout_sha256() == runs.HELDOUT_SHA256
    held = runs.load_runs(runs.HELDOUT)
    assert len(held) == 52 and not {r["row"]["source"] for r in held} & set(runs.SOURCES)


def test_unknown_virtual_stages_are_assumed_and_their_range_reported():
    held = runs.load_runs(runs.HELDOUT)
    (r,) = [r for r in held if r["vp_assumed"]]
    assert r["vp"] == runs.DEFAULT_VP["torchtitan"] == 2
    spread = runs.vp_range(r["row"])
    assert set(spread) == {1, 2, 4, 8}                       # 126 layers + 2 slots over PP 8
    assert spread[1] > spread[2] > spread[4]                 # more chunks, smaller bubble


def test_fit_drops_constants_no_run_depends_on(table):
    rs, _ = table
    _, v = runs.fit([r for r in rs if r["row"]["source"] == "narayanan2021"], iters=2)
    assert set(v) == {"gemm:A100", "fixed_seconds"}          # no V100, H100 or FP8 run
    k = runs.constants_from(v)
    assert k.efficiency("V100") == k.efficiency("H100") == v["gemm:A100"]   # the others' mean


def test_evaluation_file_is_what_the_model_computes(table):
    # data/step_time_evaluation.json (what the chapter reads) holds this model's in-sample errors
    # (perf.FITTED is the same fit rounded to 4 significant digits: errors agree to 1e-3)
    rs, errs = table
    ev = evaluate.load()
    stored = {x["run_id"]: x["fitted"] for x in ev["runs"]}
    assert {r["row"]["run_id"]: pytest.approx(e, abs=1e-3) for r, e in zip(rs, errs)} == stored
    assert ev["heldout_sha256"] == runs.HELDOUT_SHA256
    # the chapter's headline: leave-one-source-out over the 365 runs (the goal: 6% / 9%)
    assert ev["loso_overall"]["median"] <= 0.07 and ev["loso_overall"]["mean"] <= 0.09
    assert all(d["median"] <= 0.12 for d in ev["loso"].values() if d["n"] >= 10)


def test_bootstrap_interval_brackets_the_median():
    errs = [0.01 * i for i in range(-20, 21)]
    lo, hi = evaluate.bootstrap_median(errs)
    assert lo <= evaluate.median([abs(e) for e in errs]) <= hi
    assert evaluate.bootstrap_median(errs) == (lo, hi)       # fixed seed: reproducible


def _values(k):
    g = dict(k.gemm_efficiency)
    return {"gemm:V100": g["V100"], "gemm:A100": g["A100"], "gemm:H100": g["H100"],
            "fixed_seconds": k.fixed_seconds, "fp8_ratio": k.fp8_ratio}


@pytest.mark.slow
def test_fit_recovers_the_constants_that_made_the_times():
    # step times made by known constants: the fit, started from its neutral start, finds them again
    truth = runs.constants_from({"gemm:V100": 0.55, "gemm:A100": 0.7, "gemm:H100": 0.6,
                                 "fixed_seconds": 0.2, "fp8_ratio": 0.7})
    synthetic = [dict(r, measured=runs.predict(r, truth, True)["step_time"]) for r in runs.load_runs()]
    _, got = runs.fit(synthetic)
    for name, want in _values(truth).items():
        assert got[name] == pytest.approx(want, rel=1e-3), name


@pytest.mark.slow
def test_fitted_constants_are_what_the_fit_returns():
    # perf.FITTED is runs.fit on the whole table, rounded to 4 significant digits: nothing by hand
    _, got = runs.fit(runs.load_runs())
    for name, want in _values(FITTED).items():
        assert float(f"{got[name]:.4g}") == want, name


@pytest.mark.slow
def test_leave_one_source_out_numbers_are_reproduced():
    ev = evaluate.load()
    table = runs.load_runs()
    for s, (errs, _) in evaluate.loso(table).items():
        assert evaluate.describe(errs) == pytest.approx(ev["loso"][s]), s


def test_chapter_headline_is_the_evaluation():
    # book/planning.ipynb leads with the leave-one-source-out figure, then the fitted one
    import json
    from pathlib import Path
    nb = json.loads((Path(runs.DATA).parents[1] / "book" / "planning.ipynb").read_text())
    intro = "".join(nb["cells"][0]["source"])
    ev = evaluate.load()
    for part in ("loso_overall", "fitted_overall", "heldout_overall"):
        for stat in ("median", "mean"):
            assert f"{100 * ev[part][stat]:.1f}%" in intro, (part, stat)
    assert intro.index(f"{100 * ev['loso_overall']['median']:.1f}%") < intro.index(
        f"{100 * ev['fitted_overall']['median']:.1f}%")

"""Tier 1 (no processes): what the PyTorch-native path refuses and why, the mesh it builds from a
Topology, its byte prediction, and the pipelining schedules' own action lists, timed.

Issue 26. Pure checks: each fails on a plausible bug (a mesh in the wrong order, a refusal that
lets a layout through, a V-shaped placement drawn as a loop, a byte term counted twice).
"""
from __future__ import annotations

import pytest

from labkit import Topology
from labkit.config import train_config
from labkit.native import CP_ERROR, NativeOptions, check_native, resolve
from labkit.native.bytes import labkit_calc_bytes, local_shapes, native_step_bytes
from labkit.native.mesh import mesh_ranks, mesh_shape
from labkit.native.pipeline import stage_indices
from labkit.spec import preset_args

PP = dict(pipeline_model_parallel_size=2, num_layers=4, untie_embeddings_and_output_weights=True,
          global_batch_size=8)


# -- refusals ---------------------------------------------------------------------------------
@pytest.mark.parametrize("world, config, opts, words", [
    (2, dict(context_parallel_size=2), NativeOptions(), [CP_ERROR, "context_parallel_size 2"]),
    (2, dict(num_experts=2), NativeOptions(), ["num_experts", "expert-parallel style"]),
    (2, dict(zero_stage=1), NativeOptions(), ["zero_stage 1", "zero_stage 2"]),
    (2, dict(use_distributed_optimizer=True), NativeOptions(), ["use_distributed_optimizer"]),
    (2, dict(ddp_bucket_size=1000), NativeOptions(), ["ddp_bucket_size 1000"]),
    (2, dict(hidden_dropout=0.1), NativeOptions(), ["dropout"]),
    (2, dict(PP, untie_embeddings_and_output_weights=False), NativeOptions(), ["tied embeddings", "untie"]),
    (2, PP, NativeOptions(schedule="GPipe"), ["schedule must be one of"]),
    (2, dict(PP, pipeline_schedule="gpipe"), NativeOptions(), ["pipeline_schedule 'gpipe'", "NativeOptions(schedule"]),
    (2, dict(PP, num_layers=2), NativeOptions(schedule="ZBVZeroBubble"), ["num_layers 2", "2 x pp = 4"]),
    (2, dict(PP, global_batch_size=4), NativeOptions(schedule="DualPipeV"), ["2 < 4"]),
    (2, PP, NativeOptions(schedule="Interleaved1F1B"), ["num_layers_per_virtual_pipeline_stage"]),
    # found by labkit fuzz --implementation native (seed 2027): torch's Schedule1F1B raises for m < pp
    (4, dict(PP, pipeline_model_parallel_size=4, global_batch_size=3, micro_batch_size=1), NativeOptions(), ["1F1B", "3 microbatches < pp 4"]),
    (4, dict(zero_stage=3), NativeOptions(dp_replicate=3), ["dp_replicate must divide", "4"]),
    (4, dict(zero_stage=3), NativeOptions(dp_replicate=0), ["dp_replicate must divide", "got 0"]),
    (4, dict(zero_stage=3), NativeOptions(dp_replicate=True), ["dp_replicate must divide", "got True"]),
    (4, dict(zero_stage=3), NativeOptions(dp_replicate="2"), ["dp_replicate must divide", "got '2'"]),
    (4, dict(), NativeOptions(dp_replicate=2), ["HSDP", "zero_stage 2 or 3"]),
    (2, dict(), NativeOptions(mixed_precision="bf16"), ["MixedPrecisionPolicy"]),
    (2, dict(zero_stage=3, params_dtype="float64"), NativeOptions(mixed_precision="bf16"), ["float32"]),
    (2, dict(zero_stage=3), NativeOptions(mixed_precision="fp16"), ["'bf16'"]),
    (2, dict(preset_args("llama3-tiny", num_query_groups=1), tensor_model_parallel_size=2), NativeOptions(),
     ["num_query_groups 1", "tp_kv", "multiple of tensor_model_parallel_size"]),
])
def test_layouts_the_native_path_cannot_express_are_refused_with_the_reason(world, config, opts, words):
    with pytest.raises(ValueError) as e:
        check_native(train_config(**config), world, opts)
    for w in words:
        assert w in str(e.value), (w, str(e.value))


def test_labkits_own_rules_come_first_and_good_layouts_pass():
    with pytest.raises(ValueError, match="num_attention_heads"):            # Megatron's rule
        check_native(train_config(tensor_model_parallel_size=3), 3, NativeOptions())
    for world, config, opts in [(2, dict(zero_stage=3), NativeOptions()),
                                (4, dict(zero_stage=2), NativeOptions(dp_replicate=2)),
                                (2, PP, NativeOptions(schedule="DualPipeV")),
                                (4, dict(PP, pipeline_model_parallel_size=4, global_batch_size=4, micro_batch_size=1),
                                 NativeOptions()),      # m = pp: torch's 1F1B runs it
                                (8, dict(PP, tensor_model_parallel_size=2), NativeOptions())]:
        assert check_native(train_config(**config), world, opts).world_size == world


def test_implementation_argument():
    assert resolve("labkit") is None and resolve("native") == NativeOptions()
    opts = NativeOptions(schedule="ZBVZeroBubble")
    assert resolve(opts) is opts
    with pytest.raises(ValueError, match="'labkit', 'native'"):
        resolve("torchtitan")
    import labkit
    with pytest.raises(ValueError, match="context_parallel"):   # refused before any process starts
        labkit.train(world_size=2, steps=1, context_parallel_size=2, implementation="native")


def test_cli_passes_the_implementation(monkeypatch):
    import labkit.__main__ as cli
    import labkit.training
    seen = {}

    def fake_train(**kw):
        seen.update(kw)
        raise ValueError("stop here")
    monkeypatch.setattr(labkit.training, "train", fake_train)
    monkeypatch.setattr(cli, "_exit_on_hangup", lambda: None)   # keep pytest's own signal handlers
    assert cli.train_main(["--implementation", "native", "--world-size", "2", "--zero-stage", "3"]) == 2
    assert seen["implementation"] == "native" and seen["zero_stage"] == 3
    with pytest.raises(SystemExit):
        cli.train_parser().parse_args(["--implementation", "titan"])


# -- the mesh ---------------------------------------------------------------------------------
@pytest.mark.parametrize("world, tp, pp", [(8, 2, 2), (8, 4, 1), (8, 1, 2), (4, 2, 1)])
def test_mesh_slices_are_labkits_groups(world, tp, pp):
    """Every 1-d slice of the mesh along a dimension is a group of labkit's Topology on that axis."""
    topo = Topology(world, tp=tp, pp=pp)
    shape, names = mesh_shape(topo)
    assert names == ("pp", "dp", "tp") and shape == (pp, topo.dp, tp)
    mesh = mesh_ranks(topo)                                   # [pp][dp][tp]
    slices = {"tp": [row for plane in mesh for row in plane],
              "dp": [[plane[i][j] for i in range(topo.dp)] for plane in mesh for j in range(tp)],
              "pp": [[mesh[k][i][j] for k in range(pp)] for i in range(topo.dp) for j in range(tp)]}
    for axis, groups in slices.items():
        assert sorted(map(sorted, groups)) == sorted(map(sorted, topo.groups(axis))), axis


def test_hsdp_mesh_splits_dp_with_shards_fastest():
    shape, names = mesh_shape(Topology(8, tp=2), dp_replicate=2)
    assert names == ("pp", "dp_replicate", "dp_shard", "tp") and shape == (1, 2, 2, 2)
    with pytest.raises(ValueError, match="dp_replicate 3"):
        mesh_shape(Topology(8, tp=2), dp_replicate=3)


def test_v_shaped_placement():
    assert [stage_indices("ZBVZeroBubble", 4, r, 2) for r in range(4)] == [[0, 7], [1, 6], [2, 5], [3, 4]]
    assert [stage_indices("Interleaved1F1B", 2, r, 2) for r in range(2)] == [[0, 2], [1, 3]]


# -- the TP plan, found by role and cut as labkit's shard plan cuts -----------------------------
def test_plan_is_found_by_role_for_gpt2_and_llama():
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, PrepareModuleInput, SequenceParallel

    from labkit.model import GPT
    from labkit.native.tp_plan import tensor_parallel_plan
    for args, positions in ((dict(num_layers=1), True), (preset_args("llama3-tiny", num_layers=1), False)):
        model = GPT(train_config(**args).model_config(), seed=0)
        plan = tensor_parallel_plan(model, sequence_parallel=True, loss_parallel=True)
        pre = "decoder.layers.0."
        assert isinstance(plan[pre + "mlp.linear_fc1"], ColwiseParallel)
        assert isinstance(plan[pre + "input_layernorm"], SequenceParallel)      # LayerNorm or RMSNorm
        assert isinstance(plan["decoder.final_layernorm"], SequenceParallel)
        attn, mlp = plan[pre + "self_attention"], plan[pre + "mlp"]
        assert isinstance(attn, PrepareModuleInput) and isinstance(mlp, PrepareModuleInput)
        assert attn.input_layouts == (Shard(1), None) and attn.desired_input_layouts == (Replicate(), None)
        assert mlp.input_layouts == (Shard(1),)                                # the MLP takes x alone
        assert ("embedding.position_embeddings" in plan) == positions           # RoPE: no table to cut
        assert "output_layer" in plan and "embedding.word_embeddings" in plan
        assert set(tensor_parallel_plan(model)) == {pre + n for n in (
            "self_attention.linear_qkv", "self_attention.linear_proj", "mlp.linear_fc1", "mlp.linear_fc2")} | {
            "embedding.word_embeddings", "output_layer"}


def test_fused_weights_follow_labkits_shard_plan():
    """SwiGLU's fc1 [gate; up] is stored in rank order, so DTensor's Shard(0) gives rank r Megatron's
    [gate_r; up_r]; whole query groups need nothing; K/V shared by tp ranks is refused."""
    import torch

    from labkit.model import GPT
    from labkit.native.tp_plan import dense_grad, dense_orders
    model = GPT(train_config(**preset_args("llama3-tiny", num_layers=1)).model_config(), seed=0)
    orders = dense_orders(model, 2)
    name = "decoder.layers.0.mlp.linear_fc1.weight"                          # [2 x 64, h]: gate 0-63, up 64-127
    assert set(orders) == {name}
    dim, blocks = orders[name]
    assert dim == 0 and [(b.start, b.stop) for b in blocks] == [(0, 32), (64, 96), (32, 64), (96, 128)]
    dense = torch.randn(128, 32, dtype=torch.float64)
    stored = torch.cat([dense[b.start:b.stop] for b in blocks])
    model.get_submodule(name.rpartition(".")[0]).dense_order = {"weight": orders[name]}
    assert torch.equal(dense_grad(model, name, stored), dense)
    assert dense_orders(GPT(train_config(num_layers=1).model_config(), seed=0), 2) == {}   # GPT-2: contiguous
    gqa1 = GPT(train_config(**preset_args("llama3-tiny", num_layers=1, num_query_groups=1)).model_config(), seed=0)
    with pytest.raises(ValueError, match="several tp ranks"):
        dense_orders(gqa1, 2)


def test_local_shapes_are_the_models_for_each_family():
    from labkit.model import GPT
    for args in (dict(), dict(untie_embeddings_and_output_weights=True), preset_args("llama3-tiny"),
                 dict(swiglu=True, normalization="RMSNorm", add_bias_linear=True)):
        cfg = train_config(**args)
        model = GPT(cfg.model_config(), seed=0)
        assert local_shapes(cfg, 1, NativeOptions()) == [(n, tuple(p.shape)) for n, p in model.named_parameters()]


# -- bytes (pure) -----------------------------------------------------------------------------
def test_fsdp2_bytes_are_the_zero_formulas_and_pad_each_parameter():
    from labkit.calc.comm import dp_step_bytes
    cfg = train_config(zero_stage=3)
    params = train_config().model_config().num_parameters()
    assert sum(_n(x) for _, x in local_shapes(cfg, 2, NativeOptions())) == params
    assert native_step_bytes(cfg, 2)["dp"] == dp_step_bytes(params * 4, 2, 3)
    assert labkit_calc_bytes(cfg, 2)["dp"] == dp_step_bytes(params * 4, 2, 3)
    # 3 ranks: rows not divisible by 3 are padded (FSDP2 shards dim 0 in equal chunks)
    cfg3 = train_config(zero_stage=2, micro_batch_size=1)
    padded = native_step_bytes(cfg3, 3)["dp"]["all_gather"] * 3 / 2 / 4
    assert padded > params and padded == sum(-(-x[0] // 3) * 3 * _n(x[1:]) for _, x in local_shapes(cfg3, 3, NativeOptions()))


def _n(shape) -> int:
    out = 1
    for d in shape:
        out *= d
    return out


def test_pipeline_sends_follow_the_placement():
    cfg = train_config(**PP)                                  # m = 4 microbatches of [2, 64, 64]
    act = 2 * 64 * 64 * 4
    one = native_step_bytes(cfg, 2, NativeOptions(schedule="1F1B"))["pp"]["send"]
    v = native_step_bytes(cfg, 2, NativeOptions(schedule="ZBVZeroBubble"))["pp"]["send"]
    assert (one, v) == (4 * act, 8 * act)                     # rank 0: stage 0 only vs stages 0 and 3
    assert labkit_calc_bytes(cfg, 2)["pp"] == {"send": 4 * act, "p2p_header": 4 * 24}


# -- timelines --------------------------------------------------------------------------------
def test_torch_schedules_timed_on_labkits_clock():
    from labkit.native.timeline import labkit_zb_h1, schedule_timeline, torch_order
    from labkit.pipeline_parallel.schedules import one_f_one_b
    from labkit.pipeline_parallel.simulate import simulate
    p, m = 4, 8
    for name in ("Interleaved1F1B", "InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV"):
        order = torch_order(name, p, m)
        for r, acts in enumerate(order):                      # every stage-microbatch's F once
            fwd = sorted((s, mb) for k, s, mb in acts if k == "F")
            assert fwd == sorted((s, mb) for s in stage_indices(name, p, r, 2) for mb in range(m)), (name, r)
    bubble = {n: schedule_timeline(n, p, m).bubble_fraction
              for n in ("Interleaved1F1B", "ZBVZeroBubble", "DualPipeV")}
    assert bubble["Interleaved1F1B"] == pytest.approx(simulate(one_f_one_b(p, m)).bubble_fraction / 2)
    assert bubble["ZBVZeroBubble"] < labkit_zb_h1(p, m).bubble_fraction < bubble["Interleaved1F1B"]
    assert bubble["DualPipeV"] == pytest.approx(bubble["ZBVZeroBubble"])
    with pytest.raises(ValueError, match="Schedule1F1B"):
        torch_order("1F1B", p, m)


# -- figures ----------------------------------------------------------------------------------
def test_chapter_figures_are_legible_on_a_phone_and_name_fsdp_units_by_size():
    import json
    from pathlib import Path

    from labkit.figures.style import MIN_LABEL_PX, smallest_label_px
    from labkit.native.figures import unit_names
    nb = json.loads((Path(__file__).parent.parent / "book" / "pytorch-native.ipynb").read_text())
    svgs = ["".join(o["data"]["image/svg+xml"]) for c in nb["cells"] if c["cell_type"] == "code"
            for o in c.get("outputs", []) if "image/svg+xml" in o.get("data", {})]
    assert len(svgs) >= 3
    for text in svgs:
        assert smallest_label_px(text) >= MIN_LABEL_PX
    sizes = {"root": 10.0, "layer 0": 20.0, "layer 1": 20.0}
    seq = [("dp", "all_gather", b) for b in (10, 20, 20)] + [("dp", "reduce_scatter", b) for b in (20, 20, 10)]
    assert unit_names(seq, sizes, reshard=False) == ["root", "layer 0", "layer 1", "layer 1", "layer 0", "root"]
    with pytest.raises(ValueError, match="FSDP2's order puts root"):
        unit_names([("dp", "all_gather", 20.0)], sizes, reshard=False)

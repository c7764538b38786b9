"""Megatron-Core's torch_dist layout (issue 38): keys and shapes by Megatron's own rules, bitwise
round trips, and the same global tensors whatever layout saved the labkit checkpoint.

The rules (labkit/interop/megatron_format.py, each with its file and lines in Megatron-LM at commit
d98e8a64): layers stacked on a leading axis when alike, experts stacked after it, norms named after
the linear they precede, QKV per query group [q | k | v] and SwiGLU's fc1 [gate; up] as the global
tensor for any TP, no tied output layer, ``metadata.json`` and ``common.pt``. If ``megatron.core`` is
importable (megatron-core==0.16.1), its GPTModel (local spec, one gloo rank, CPU) loads the export
with its own loader, and its keys, shapes and logits are compared; else that test skips, saying why.
No transformers needed: this file runs in the main suite.
"""
from __future__ import annotations

import json

import pytest
import torch

import labkit
from labkit.interop.labkit_ckpt import read_checkpoint
from labkit.interop.megatron_format import export_megatron, import_megatron, key_of, read_megatron, to_megatron
from labkit.model import GPT, preset

SPECS = {"gpt2": lambda: preset("tiny", num_layers=3), "llama": lambda: preset("llama3-tiny"),
         "mixtral": lambda: preset("mixtral-tiny"),
         "moe every 2nd layer": lambda: preset("mixtral-tiny", num_layers=4, moe_layer_freq=2),
         "shared expert": lambda: preset("mixtral-tiny", moe_shared_expert_intermediate_size=32)}


@pytest.mark.parametrize("name", list(SPECS))
def test_round_trip_is_bitwise_and_files_are_megatrons(name, tmp_path):
    cfg = SPECS[name]()
    state = GPT(cfg, seed=2).double().state_dict()
    wrote = export_megatron(state, cfg, tmp_path)
    assert {".metadata", "metadata.json", "__0_0.distcp", "common.pt"} <= set(wrote["files"])
    assert (tmp_path / "latest_checkpointed_iteration.txt").read_text() == "0"
    meta = json.loads((tmp_path / "iter_0000000" / "metadata.json").read_text())
    assert meta == {"sharded_backend": "torch_dist", "sharded_backend_version": 1, "common_backend": "torch",
                    "common_backend_version": 1}
    cfg2, back = import_megatron(tmp_path)
    assert cfg2 == cfg and set(back) == set(state)
    for k in state:
        assert back[k].dtype == state[k].dtype and torch.equal(back[k], state[k]), k
    _, common = read_megatron(tmp_path)
    assert common["checkpoint_version"] == 3.0 and common["iteration"] == 0


def test_keys_and_shapes_follow_megatrons_rules():
    cfg = preset("mixtral-tiny")          # 2 layers, 4 experts, ffn 64, 8 heads in 2 groups, untied
    L, E, h, f, n, g, d = 2, 4, 32, 64, 8, 2, 4
    shapes = {k: tuple(v.shape) for k, v in to_megatron(GPT(cfg).state_dict(), cfg).items()}
    assert shapes == {
        "embedding.word_embeddings.weight": (256, h), "output_layer.weight": (256, h),
        "decoder.final_layernorm.weight": (h,),
        # the local spec names a norm after the linear it precedes (gpt_layer_specs.py l. 459-462)
        "decoder.layers.self_attention.linear_qkv.layer_norm_weight": (L, h),
        "decoder.layers.mlp.linear_fc1.layer_norm_weight": (L, h),
        "decoder.layers.self_attention.linear_qkv.weight": (L, (n + 2 * g) * d, h),
        "decoder.layers.self_attention.linear_proj.weight": (L, h, n * d),
        "decoder.layers.mlp.router.weight": (L, E, h),
        "decoder.layers.mlp.experts.experts.linear_fc1.weight": (L, E, 2 * f, h),
        "decoder.layers.mlp.experts.experts.linear_fc2.weight": (L, E, h, f)}
    tied = preset("tiny")
    assert "output_layer.weight" not in to_megatron(GPT(tied).state_dict(), tied)
    # layers that differ keep their number; LayerNorm biases follow their weights
    mixed = preset("mixtral-tiny", num_layers=4, moe_layer_freq=2)
    assert key_of("decoder.layers.1.mlp.linear_fc1.weight", mixed) == ("decoder.layers.1.mlp.linear_fc1.weight", ())
    assert key_of("decoder.layers.2.mlp.experts.local_experts.3.linear_fc2.weight", mixed) == \
        ("decoder.layers.2.mlp.experts.experts.linear_fc2.weight", (3,))
    assert key_of("decoder.layers.3.pre_mlp_layernorm.bias", tied) == \
        ("decoder.layers.mlp.linear_fc1.layer_norm_bias", (3,))


def test_the_same_global_tensors_whatever_layout_saved_them(tmp_path):
    """One step from the same init under TP2 and under PP2: the Megatron exports hold the same
    tensors (to training parity), though TP2 cut QKV by query group and fc1 into [gate_r; up_r]."""
    run = dict(labkit.config.preset_args("llama3-tiny", num_layers=2), params_dtype="float64",
               micro_batch_size=2, global_batch_size=4, make_vocab_size_divisible_by=64)
    out = {}
    for name, layout in [("tp2", dict(tensor_model_parallel_size=2)), ("pp2", dict(pipeline_model_parallel_size=2))]:
        labkit.train(world_size=2, steps=1, log_interval=0, save=tmp_path / name, **run, **layout)
        _, cfg, state = read_checkpoint(tmp_path / name)
        export_megatron(state, cfg, tmp_path / (name + " megatron"))
        out[name] = read_megatron(tmp_path / (name + " megatron"))[0]
    assert set(out["tp2"]) == set(out["pp2"])
    for k in out["tp2"]:
        torch.testing.assert_close(out["tp2"][k], out["pp2"][k], rtol=0, atol=1e-12, msg=lambda m: f"{k}: {m}")


@pytest.mark.parametrize("name", ["gpt2", "llama", "mixtral"])
def test_megatron_core_gptmodel_loads_the_export(name, tmp_path):
    """Megatron-Core's GPTModel (local spec, one gloo rank, CPU, float64) loads the export with its
    own ``dist_checkpointing.load``: its sharded keys and global shapes are ours, and its logits
    labkit's to float64 round-off (measured: GPT-2 2.2e-16, Llama 0.0) once its RoPE frequencies
    (float32 in Megatron) are computed in float64 (4.5e-11 before). Megatron's router takes its
    softmax in float32 (moe_utils.py, ``torch.softmax(..., dtype=torch.float32)``): the Mixtral-shaped
    model agrees to float32 round-off of its routing weights (measured 7.4e-10). A misplaced row
    would be O(1)."""
    pytest.importorskip("megatron.core", reason="megatron-core is not installed (pip install "
                        "megatron-core==0.16.1); the layout is checked against its rules read from its code")
    from interop_megatron_core import load_and_run
    from labkit.launcher import launch
    cfg = SPECS[name]()
    model = GPT(cfg, seed=6).double().eval()
    export_megatron(model.state_dict(), cfg, tmp_path)
    tokens = torch.randint(0, cfg.vocab_size, (2, 16), generator=torch.Generator().manual_seed(1))
    shapes, shipped, lifted = launch(load_and_run, 1, str(tmp_path / "iter_0000000"), cfg, tokens, timeout=300)[0]
    ours = {k: tuple(v.shape) for k, v in to_megatron(model.state_dict(), cfg).items()}
    assert shapes == ours
    with torch.no_grad():
        want = model(tokens)
    torch.testing.assert_close(lifted, want, rtol=0, atol=1e-8 if cfg.num_experts else 1e-12)
    torch.testing.assert_close(shipped, want, rtol=0, atol=1e-6)

"""Weights that travel (issue 38): Hugging Face folders in and out, proven by logits, in float64.

HF models are built from a config with random weights (no download) and saved by transformers'
own ``save_pretrained``; labkit reads them, computes the same logits, writes them back bitwise,
and exports its own models as folders ``from_pretrained`` loads offline. Logits are compared twice:
with Hugging Face's deliberate float32 islands (RMSNorm, RoPE angles, Mixtral's router softmax)
lifted to float64 (``interop_hf.float64_islands``): equal to float64 round-off, which proves the
mapping; and as transformers runs them: equal to float32 round-off, the size of those choices.
"""
from __future__ import annotations

import json

import pytest
import torch
from torch.testing import assert_close

from interop_hf import CLASSES, float64_islands, hf_logits, hf_model, transformers
from labkit.interop.hf import export_hf, import_hf, load_state, read_hf_tensors
from labkit.interop.hf_config import gpt_config
from labkit.model import GPT, preset

FAMILIES = ("gpt2", "llama", "mixtral")
TOKENS = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(1))
# the same families as labkit specs (random labkit init), shapes matching interop_hf.HF_CONFIGS
LABKIT = {"gpt2": lambda: preset("tiny", num_layers=2, hidden_size=32, seq_length=16),
          "llama": lambda: preset("llama3-tiny", num_layers=2),
          "mixtral": lambda: preset("mixtral-tiny")}
F64_ATOL = 1e-12   # float64 round-off of logits of size ~1 (measured max: 2.2e-16)
F32_ATOL = 1e-5    # Hugging Face's float32 RMSNorm / RoPE / router (measured max: 3.9e-8)


def labkit_model(cfg, state):
    model = GPT(cfg).double().eval()
    load_state(model, state)
    return model


def labkit_logits(model, tokens=TOKENS):
    with torch.no_grad():
        return model(tokens)


def from_pretrained(fam, folder):
    cls = getattr(transformers, CLASSES[fam])
    return cls.from_pretrained(folder, local_files_only=True, experts_implementation="eager").eval()


@pytest.mark.parametrize("fam", FAMILIES)
def test_import_a_transformers_folder_same_logits(fam, tmp_path):
    hf = hf_model(fam)
    hf.save_pretrained(tmp_path)
    cfg, state = import_hf(tmp_path)
    lk = labkit_logits(labkit_model(cfg, state))
    with float64_islands():
        assert_close(lk, hf_logits(hf, TOKENS), rtol=0, atol=F64_ATOL)
    plain = (lk - hf_logits(hf, TOKENS)).abs().max().item()
    assert plain < F32_ATOL, f"{fam}: {plain:.2e} apart with Hugging Face's float32 islands"


@pytest.mark.parametrize("fam", FAMILIES)
def test_export_loads_in_transformers_same_logits(fam, tmp_path):
    cfg = LABKIT[fam]()
    model = GPT(cfg, seed=3).double().eval()
    wrote = export_hf(model.state_dict(), cfg, tmp_path, max_shard_bytes=64 * 1024)   # several shards
    assert "model.safetensors.index.json" in wrote["files"] and len(wrote["files"]) > 3
    hf = from_pretrained(fam, tmp_path)
    assert hf.dtype == torch.float64
    with float64_islands():
        assert_close(labkit_logits(model), hf_logits(hf, TOKENS), rtol=0, atol=F64_ATOL)


@pytest.mark.parametrize("fam", FAMILIES)
def test_round_trips_are_bitwise(fam, tmp_path):
    # labkit -> HF -> labkit
    cfg = LABKIT[fam]()
    state = GPT(cfg, seed=5).double().state_dict()
    export_hf(state, cfg, tmp_path / "a")
    cfg2, back = import_hf(tmp_path / "a")
    assert cfg2 == cfg
    assert set(back) == set(state) and all(torch.equal(back[k], state[k]) for k in state)
    # HF (written by transformers) -> labkit -> HF
    hf_model(fam).save_pretrained(tmp_path / "b")
    cfg3, state3 = import_hf(tmp_path / "b")
    export_hf(state3, cfg3, tmp_path / "c", max_shard_bytes=32 * 1024)
    want, got = read_hf_tensors(tmp_path / "b"), read_hf_tensors(tmp_path / "c")
    assert set(got) == set(want)
    for k in want:
        assert got[k].dtype == want[k].dtype and torch.equal(got[k], want[k]), k
    assert gpt_config(json.loads((tmp_path / "c" / "config.json").read_text())) == cfg3


REFUSED = [   # (family, config change, words of the reason)
    ("gpt2", dict(activation_function="gelu_new"), "tanh approximation"),
    ("llama", dict(rope_parameters={"rope_theta": 500000.0, "rope_type": "llama3", "factor": 8.0,
                                    "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                    "original_max_position_embeddings": 8}), "RoPE scaling"),
    ("llama", dict(attention_bias=True), "add_bias_linear is one switch"),
    ("mixtral", dict(sliding_window=8), "sliding_window"),
    ("mixtral", dict(router_jitter_noise=0.1), "router_jitter_noise"),
]


@pytest.mark.parametrize("fam, change, words", REFUSED)
def test_refuses_what_labkit_does_not_compute(fam, change, words):
    hf = hf_model(fam).config.to_dict()
    hf.update(change)
    with pytest.raises(ValueError, match=words):
        gpt_config(hf)


@pytest.mark.parametrize("change, words", [
    (dict(moe_shared_expert_intermediate_size=32), "shared expert"),
    (dict(moe_expert_capacity_factor=1.0), "token dropping"),
    (dict(moe_layer_freq=2), "dense layers between MoE layers"),
    (dict(moe_router_pre_softmax=True), "renormalizes"),
])
def test_labkit_moe_features_mixtral_lacks_are_refused(change, words, tmp_path):
    cfg = preset("mixtral-tiny", **change)
    with pytest.raises(ValueError, match=words):
        export_hf(GPT(cfg).state_dict(), cfg, tmp_path)

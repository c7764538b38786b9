"""Weights that travel (issue 38): from any saved labkit layout out, and imported weights trained on.

* A labkit checkpoint saved under TP2, PP2 or EP2 on gloo ranks, exported as a Hugging Face folder
  and as Megatron-Core's torch_dist layout: transformers' logits equal labkit's on the same weights
  (float64 round-off) and the single-device reference's after the same step (its training parity).
* A folder written by transformers, imported as an iteration-0 labkit checkpoint and trained under
  TP2 / EP2 with gradient accumulation: losses and every gradient equal ``labkit.reference`` started
  from the same weights.
* ``python -m labkit import|export``: the round trip through the command line is bitwise.
"""
from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

import labkit
from interop_hf import CLASSES, float64_islands, hf_logits, hf_model, transformers
from labkit.__main__ import main
from labkit.config import train_config
from labkit.interop.hf import export_hf, import_hf, load_state, read_hf_tensors
from labkit.interop.labkit_ckpt import read_checkpoint, train_args, write_checkpoint
from labkit.interop.megatron_format import export_megatron, import_megatron
from labkit.model import GPT, preset
from labkit.reference import train_reference

TOKENS = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(1))
BASE = dict(params_dtype="float64", micro_batch_size=2, global_batch_size=8, make_vocab_size_divisible_by=64,
            seq_length=16, num_layers=2, hidden_size=32)
RUNS = {   # family: (model, world size, layout)
    "gpt2 pp2": ("gpt2", dict(BASE, num_attention_heads=4), 2, dict(pipeline_model_parallel_size=2)),
    "llama tp2": ("llama", dict(BASE, **train_args(preset("llama3-tiny", num_layers=2))),
                  2, dict(tensor_model_parallel_size=2)),
    "mixtral ep2": ("mixtral", dict(BASE, **train_args(preset("mixtral-tiny"))), 2,
                    dict(expert_model_parallel_size=2)),
}
for _, model, _, _ in RUNS.values():
    model.update(params_dtype="float64", make_vocab_size_divisible_by=64)


def logits(model):
    with torch.no_grad():
        return model(TOKENS)


@pytest.mark.parametrize("name", list(RUNS))
def test_a_saved_layout_exports_to_the_same_logits(name, tmp_path):
    fam, model_args, world, layout = RUNS[name]
    labkit.train(world_size=world, steps=1, log_interval=0, save=tmp_path / "ckpt", **model_args, **layout)
    _, cfg, state = read_checkpoint(tmp_path / "ckpt")
    export_hf(state, cfg, tmp_path / "hf")
    hf = getattr(transformers, CLASSES[fam]).from_pretrained(
        tmp_path / "hf", local_files_only=True, experts_implementation="eager").eval()
    ours = GPT(cfg).double().eval()
    load_state(ours, state)
    ref = train_reference(world_size=1, steps=1, return_model=True, **model_args)["model"].eval()
    with float64_islands():
        assert_close(hf_logits(hf, TOKENS), logits(ours), rtol=0, atol=1e-12)    # the conversion
        assert_close(hf_logits(hf, TOKENS), logits(ref), rtol=0, atol=1e-10)     # + training parity
    export_megatron(state, cfg, tmp_path / "megatron")
    cfg2, back = import_megatron(tmp_path / "megatron")
    assert cfg2 == cfg and all(torch.equal(back[k], state[k]) for k in state)


@pytest.mark.parametrize("fam, layout", [("llama", dict(tensor_model_parallel_size=2)),
                                         ("mixtral", dict(expert_model_parallel_size=2))])
def test_training_after_import_equals_one_device(fam, layout, tmp_path):
    hf_model(fam).save_pretrained(tmp_path / "hf")
    cfg, state = import_hf(tmp_path / "hf")
    tp = layout.get("tensor_model_parallel_size", 1)
    run = dict(train_args(cfg, tp), params_dtype="float64", micro_batch_size=2, global_batch_size=8)
    write_checkpoint(state, train_config(**run, **layout), tmp_path / "ckpt")
    res = labkit.train(world_size=2, steps=2, log_interval=0, capture_grads=True, load=tmp_path / "ckpt",
                       **run, **layout)
    ref = train_reference(world_size=1, steps=2, capture_grads=True, weights=state, **run)
    assert_close(torch.tensor(res.losses), torch.tensor(ref["losses"]), rtol=0, atol=1e-11)
    assert set(res.grads) == set(ref["grads"])
    for k, g in ref["grads"].items():
        assert_close(res.grads[k], g, rtol=1e-11, atol=1e-12, msg=lambda m: f"{fam} {k}: {m}")
    fresh = train_reference(world_size=1, steps=1, **run)          # the import mattered
    assert abs(fresh[0] - ref["losses"][0]) > 1e-3


def test_command_line_round_trip(tmp_path, capsys):
    hf_model("llama").save_pretrained(tmp_path / "hf")
    assert main(["import", "--hf", str(tmp_path / "hf"), "--save", str(tmp_path / "ckpt"),
                 "--params-dtype", "float64"]) == 0
    assert main(["export", "--load", str(tmp_path / "ckpt"), "--hf", str(tmp_path / "out"),
                 "--max-shard-size", "100KB"]) == 0
    assert main(["export", "--load", str(tmp_path / "ckpt"), "--megatron", str(tmp_path / "meg")]) == 0
    printed = capsys.readouterr().out
    assert "model.safetensors.index.json" in printed and "metadata.json" in printed
    want, got = read_hf_tensors(tmp_path / "hf"), read_hf_tensors(tmp_path / "out")
    assert set(got) == set(want) and all(torch.equal(got[k], want[k]) for k in want)

"""Dropout under tensor parallelism follows Megatron's two random streams (tensor_parallel/random.py).

Megatron-LM (d98e8a64: ``tensor_parallel/random.py`` ``model_parallel_cuda_manual_seed``,
``training/initialize.py`` ``_set_random_seed``, ``dot_product_attention.py``,
``transformer_block.py``, ``language_model_embedding.py``):
  default stream seed + 100 pp_rank, the same on every tp rank: hidden and embedding dropout
  without SP; model-parallel stream seed + 100 pp_rank + 2718 + tp_rank: attention dropout, and
  under SP every dropout of the embedding and of the transformer block.
The test records every mask a TP 2 run draws and replays it from generators seeded here with those
formulas (written out in this file, not imported), in the order the run drew them.
"""
from __future__ import annotations

import pytest
import torch

import labkit

SEED, P = 5, 0.25


def _record_masks(sp: bool):
    import torch.distributed as dist

    from labkit import data
    from labkit.config import TrainConfig
    from labkit.model import Dropout
    from labkit.training import build_rank, rank_microbatches

    cfg = TrainConfig(num_layers=2, hidden_size=32, num_attention_heads=4, seq_length=16,
                      micro_batch_size=2, tensor_model_parallel_size=2, sequence_parallel=sp,
                      hidden_dropout=P, attention_dropout=P, params_dtype="float64")
    topo, _, engine = build_rank(cfg, SEED)
    model = engine.runner.chunks[0]
    names = {id(m): n for n, m in model.named_modules()}
    calls, real = [], Dropout.mask

    def recording(self, x):
        keep = real(self, x)
        calls.append((names[id(self)], keep.cpu()))
        return keep
    Dropout.mask = recording
    try:
        (tokens, labels), = rank_microbatches(cfg, topo, 0, SEED, data.load_tokens())
        model(tokens, labels)
    finally:
        Dropout.mask = real
    return {"tp_rank": topo.coords(dist.get_rank())["tp"], "calls": calls}


@pytest.mark.parametrize("sp", [False, True])
def test_dropout_masks_follow_megatrons_streams(sp):
    ranks = labkit.launch(_record_masks, 2, sp)
    for res in ranks:
        gens = {"default": torch.Generator().manual_seed(SEED + 100 * 0),          # pp rank 0
                "model_parallel": torch.Generator().manual_seed(SEED + 100 * 0 + 2718 + res["tp_rank"])}
        assert len(res["calls"]) == 1 + 2 * 3                 # embedding, then 3 per layer
        for name, mask in res["calls"]:
            region = "model_parallel" if sp or name.endswith("attention_dropout") else "default"
            expected = torch.rand(mask.shape, generator=gens[region]) >= P
            assert torch.equal(mask, expected), f"tp rank {res['tp_rank']}, {name}: not the {region} stream"
    (a, b) = [{n: m for n, m in r["calls"]} for r in ranks]
    attn = "decoder.layers.0.self_attention.core_attention.attention_dropout"
    assert not torch.equal(a[attn], b[attn])                  # heads differ: different masks
    hidden = "decoder.layers.0.mlp_dropout"
    assert torch.equal(a[hidden], b[hidden]) is (not sp)      # replicated without SP, shards with SP


def test_dropout_trains_under_tp_and_sp():
    res = labkit.train(world_size=2, steps=3, log_interval=0, tensor_model_parallel_size=2,
                       sequence_parallel=True, hidden_dropout=0.1, attention_dropout=0.1,
                       num_layers=2, hidden_size=32, num_attention_heads=4, seq_length=16)
    assert len(res.losses) == 3 and all(x == x for x in res.losses)

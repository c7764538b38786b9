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


class MaskRecorder:
    """A probe of ``labkit.train``: every dropout mask this rank draws in the first iteration, in
    the order it draws them (attached for that iteration only)."""

    def __init__(self, engine, topo, groups, cfg):
        import torch.distributed as dist

        from labkit.model import Dropout
        self.cls, self.real, self.calls = Dropout, Dropout.mask, []
        self.names = {id(m): n for chunk in engine.runner.chunks for n, m in chunk.named_modules()}
        self.tp_rank = topo.coords(dist.get_rank())["tp"]

    def begin(self, it):
        real, calls, names = self.real, self.calls, self.names

        def recording(module, x):
            keep = real(module, x)
            calls.append((names[id(module)], keep.cpu()))
            return keep
        self.cls.mask = recording if it == 0 else real

    def end(self):
        self.cls.mask = self.real
        return {"tp_rank": self.tp_rank, "calls": self.calls}


def dense_masks(ranks: list, sp: bool) -> list:
    """The masks of the dense model's calls, from the tp ranks' ones: joined along the dim each rank
    holds a part of (the heads of the attention's [b, n, s, s]; under SP the sequence of [b, s, h]);
    without SP the hidden and embedding dropouts draw the same mask on every rank (asserted)."""
    a, b = sorted(ranks, key=lambda r: r["tp_rank"])
    out = []
    for (name, ma), (name_b, mb) in zip(a["calls"], b["calls"], strict=True):
        assert name == name_b
        if name.endswith("attention_dropout") or sp:
            out.append(torch.cat([ma, mb], dim=1))
        else:
            assert torch.equal(ma, mb), name
            out.append(ma)
    return out


@pytest.mark.parametrize("sp", [False, True])
def test_dropout_trains_under_tp_and_sp(sp):
    """tp 2, dropout in every region, 2 microbatches, float64: the first step's loss and every
    gradient equal the dense model's with the masks the ranks drew (replayed, joined). Fails when
    the cut model drops differently from the dense one given the same masks, or not at all."""
    from labkit import data
    from labkit.config import train_config
    from labkit.model import GPT, Dropout
    kw = dict(num_layers=2, hidden_size=32, num_attention_heads=4, seq_length=16, micro_batch_size=2,
              global_batch_size=4, hidden_dropout=P, attention_dropout=P, params_dtype="float64")
    res = labkit.train(world_size=2, steps=1, seed=SEED, log_interval=0, capture_grads=True, probe=MaskRecorder,
                       tensor_model_parallel_size=2, sequence_parallel=sp, **kw)
    masks = dense_masks([r["probe"] for r in res.ranks], sp)
    assert len(masks) == 2 * (1 + 3 * 2)                 # per microbatch: embedding, 3 per layer
    model = GPT(train_config(**kw).model_config(), seed=SEED).double()
    replay, real = iter(masks), Dropout.mask

    def replaying(module, x):
        keep = next(replay)
        assert keep.shape == x.shape
        return keep
    Dropout.mask = replaying
    try:
        inputs, labels = data.get_batch(data.load_tokens(), 0, 4, 16, SEED)
        loss = sum(model(x, y) / 2 for x, y in data.microbatches(inputs, labels, 2))
    finally:
        Dropout.mask = real
    loss.backward()
    assert next(replay, None) is None
    assert res.losses[0] == pytest.approx(loss.item(), abs=1e-12)
    for name, p in model.named_parameters():
        torch.testing.assert_close(res.grads[name], p.grad, rtol=1e-12, atol=1e-12, msg=name)

"""Vocabulary-parallel embedding and cross-entropy (labkit/tensor_parallel/vocab_parallel.py).

Chapter "Tensor parallelism", section "The vocabulary-parallel loss". Tier 1: the local math,
with the t ranks simulated in a for-loop; tier 2: the autograd Function and the embedding on gloo
ranks against torch's own F.cross_entropy / nn.Embedding. Tolerances: float64 atol 1e-12, rtol 1e-10.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.testing import assert_close

import labkit
from labkit.config import padded_vocab_size
from labkit.tensor_parallel.vocab_parallel import (cross_entropy_from_parts, cross_entropy_grad,
                                                   target_logits, vocab_range)

F64 = dict(atol=1e-12, rtol=1e-10)


def test_padded_vocabulary_follows_megatron():
    assert padded_vocab_size(256, 128, 1) == 256
    assert padded_vocab_size(256, 128, 2) == 256
    assert padded_vocab_size(256, 128, 4) == 512   # the labs' byte vocabulary at TP 4
    assert padded_vocab_size(50257, 128, 1) == 50304   # GPT-2
    assert padded_vocab_size(50257, 128, 8) == 51200


@pytest.mark.parametrize("t", [1, 2, 4, 8])
def test_vocab_ranges_tile_the_vocabulary(t):
    ranges = [vocab_range(512, r, t) for r in range(t)]
    assert ranges[0][0] == 0 and ranges[-1][1] == 512
    assert all(a[1] == b[0] and a[1] - a[0] == 512 // t for a, b in zip(ranges, ranges[1:]))


def test_vocab_range_rejects_unpadded_vocabulary():
    with pytest.raises(ValueError, match="vocab_size 257 is not divisible by tensor_model_parallel_size 2"):
        vocab_range(257, 0, 2)


@pytest.mark.parametrize("t", [1, 2, 4])
def test_local_math_over_simulated_ranks_equals_cross_entropy(t):
    gen = torch.Generator().manual_seed(0)
    V = 512
    logits = torch.randn(3, 5, V, generator=gen, dtype=torch.float64) * 4
    labels = torch.randint(0, 256, (3, 5), generator=gen)
    shards = logits.chunk(t, dim=-1)
    m = torch.stack([z.max(-1).values for z in shards]).amax(0)          # "all-reduce MAX"
    ranges = [vocab_range(V, r, t) for r in range(t)]
    target = sum(target_logits(z - m[..., None], labels, *rg) for z, rg in zip(shards, ranges))
    sum_exp = sum((z - m[..., None]).exp().sum(-1) for z in shards)      # "all-reduce SUM"
    loss = cross_entropy_from_parts(sum_exp, target)
    expected = F.cross_entropy(logits.transpose(1, 2), labels, reduction="none")
    assert_close(loss, expected, **F64)
    grads = [cross_entropy_grad((z - m[..., None]).exp() / sum_exp[..., None], labels, *rg)
             for z, rg in zip(shards, ranges)]
    dense = logits.clone().requires_grad_()
    F.cross_entropy(dense.transpose(1, 2), labels, reduction="sum").backward()
    assert_close(torch.cat(grads, dim=-1), dense.grad, **F64)


def _worker():
    from labkit.groups import world_group
    from labkit.tensor_parallel.vocab_parallel import VocabParallelEmbedding, vocab_parallel_cross_entropy

    group = world_group()
    t, r = group.size, group.rank
    gen = torch.Generator().manual_seed(0)
    dense = torch.nn.Embedding(512, 8).double()
    tokens = torch.randint(0, 512, (2, 8), generator=gen)
    labels = torch.randint(0, 512, (2, 8), generator=gen)
    logits = torch.randn(2, 8, 512, generator=gen, dtype=torch.float64) * 3
    emb = VocabParallelEmbedding.from_dense(dense, group)
    x = emb(tokens)
    dx = torch.randn(2, 8, 8, generator=gen, dtype=torch.float64)
    x.backward(dx)
    dense(tokens).backward(dx)
    before = dict(group.stats.snapshot())
    local = logits.chunk(t, dim=-1)[r].clone().requires_grad_()
    loss = vocab_parallel_cross_entropy(group, local, labels)
    w = torch.rand(2, 8, generator=gen, dtype=torch.float64)   # a non-uniform upstream gradient
    (loss * w).sum().backward()
    full = logits.clone().requires_grad_()
    ref = F.cross_entropy(full.transpose(1, 2), labels, reduction="none")
    (ref * w).sum().backward()
    return {"embedding out": (x.detach(), dense(tokens).detach()),
            "embedding grad": (emb.weight.grad, dense.weight.grad.chunk(t)[r]),
            "loss": (loss.detach(), ref.detach()),
            "logits grad": (local.grad, full.grad.chunk(t, dim=-1)[r]),
            "stats": (before, group.stats.snapshot())}


@pytest.mark.parametrize("t", [2, 4])
def test_vocab_parallel_embedding_and_cross_entropy_equal_dense(t):
    for r, res in enumerate(labkit.launch(_worker, t)):
        before, after = res.pop("stats")
        for what, (got, expected) in res.items():
            assert_close(got, expected, **F64, msg=lambda m: f"rank {r}, {what}: {m}")
        # the embedding's partial sums: one all-reduce of [b, s, h] (backward: identity). Under SP
        # Megatron still all-reduces here (learned positions are added next), then scatters.
        assert before == {"all_reduce": {"calls": 1, "bytes": 2 * (t - 1) / t * 2 * 8 * 8 * 8}}
        # the loss: gather of the [b, s] maxima, then 2 all-reduces of [b, s]; nothing in the backward
        assert after["all_gather"]["calls"] - before.get("all_gather", {}).get("calls", 0) == 1
        assert after["all_reduce"]["calls"] - before.get("all_reduce", {}).get("calls", 0) == 2

"""Tier 1: tokenizer, Megatron's vocabulary padding, layout-independent batches."""
import pytest
import torch

from labkit import data
from labkit.config import padded_vocab_size


def test_byte_tokenizer_roundtrip():
    tok = data.ByteTokenizer()
    text = "To be, or not to be — ¿qué?"
    ids = tok.encode(text)
    assert all(0 <= i < 256 for i in ids) and tok.decode(ids) == text


@pytest.mark.parametrize("vocab,div,tp,expected", [
    (50257, 128, 1, 50304), (50257, 128, 8, 51200), (256, 128, 1, 256), (256, 128, 4, 512), (256, 64, 4, 256)])
def test_padded_vocab_size_megatron_rule(vocab, div, tp, expected):
    assert padded_vocab_size(vocab, div, tp) == expected


def test_corpus_ships_and_batches_are_deterministic():
    tokens = data.load_tokens()
    assert tokens.dtype == torch.int64 and len(tokens) > 50_000
    a = data.get_batch(tokens, 3, 8, 32, seed=0)
    b = data.get_batch(tokens, 3, 8, 32, seed=0)
    c = data.get_batch(tokens, 4, 8, 32, seed=0)
    assert torch.equal(a[0], b[0]) and not torch.equal(a[0], c[0])
    assert a[0].shape == (8, 32) and torch.equal(a[0][:, 1:], a[1][:, :-1])  # labels = inputs shifted


def test_microbatches_follow_megatron_sampler_and_cover_the_batch():
    x = torch.arange(16)[:, None].repeat(1, 4)
    y = x + 1
    dp, mbs = 2, 2
    per_rank = [data.microbatches(x, y, mbs, dp, r) for r in range(dp)]
    assert [m[0][:, 0].tolist() for m in per_rank[0]] == [[0, 1], [4, 5], [8, 9], [12, 13]]
    assert [m[0][:, 0].tolist() for m in per_rank[1]] == [[2, 3], [6, 7], [10, 11], [14, 15]]
    seen = sorted(int(v) for rank in per_rank for mb, _ in rank for v in mb[:, 0])
    assert seen == list(range(16))
    with pytest.raises(ValueError, match="global batch 16 is not divisible by micro_batch_size \\* dp = 3 \\* 2"):
        data.microbatches(x, y, 3, 2, 0)


def test_missing_corpus_and_short_corpus_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="corpus not found"):
        data.load_tokens(tmp_path / "nope.txt")
    with pytest.raises(ValueError, match="too short"):
        data.get_batch(torch.arange(10), 0, 2, 16)

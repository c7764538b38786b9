"""Tier 1: the dense reference GPT — sizes, determinism, causality, attention layout."""
import ast
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from labkit.model import GPT, GPTConfig, causal_attention, preset


def test_model_imports_no_torch_distributed():
    tree = ast.parse(Path("labkit/model.py").read_text())
    names = [a.name for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))
             for a in n.names] + [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    assert not any("distributed" in n for n in names)


@pytest.mark.parametrize("name,expected", [
    # HF GPT-2 counts (vocab 50257) plus Megatron's padding to 50304: 47 extra rows of h
    ("gpt2", 124_439_808 + 47 * 768),
    ("gpt2-large", 774_030_080 + 47 * 1280),  # "0.77 B" in the tutorial's Megatron log (data/)
    ("gpt2-xl", 1_557_611_200 + 47 * 1600),
])
def test_preset_parameter_counts(name, expected):
    assert preset(name).num_parameters() == expected


@pytest.mark.parametrize("cfg", [GPTConfig(), GPTConfig(num_layers=3, hidden_size=48, num_attention_heads=6,
                                                       seq_length=16, untie_embeddings_and_output_weights=True)])
def test_num_parameters_matches_module(cfg):
    assert GPT(cfg).cfg.num_parameters() == sum(p.numel() for p in GPT(cfg).parameters())


def test_deterministic_init_and_megatron_scaling():
    a, b, c = GPT(seed=1), GPT(seed=1), GPT(seed=2)
    for (n, p), q, r in zip(a.named_parameters(), b.parameters(), c.parameters()):
        assert torch.equal(p, q), n
        if p.dim() == 2:
            assert not torch.equal(p, r), n
    L = a.cfg.num_layers
    proj = a.decoder.layers[0].self_attention.linear_proj.weight
    qkv = a.decoder.layers[0].self_attention.linear_qkv.weight
    assert abs(proj.std().item() - 0.02 / (2 * L) ** 0.5) < 0.003
    assert abs(qkv.std().item() - 0.02) < 0.003
    assert torch.all(a.decoder.layers[0].mlp.linear_fc1.bias == 0)


def test_causal_and_tied_output():
    torch.manual_seed(0)
    m = GPT(GPTConfig(seq_length=16), seed=0).double()
    t = torch.randint(0, 256, (2, 16))
    t2 = t.clone()
    t2[:, 10:] = (t2[:, 10:] + 7) % 256          # change the future
    l1, l2 = m(t), m(t2)
    torch.testing.assert_close(l1[:, :10], l2[:, :10], rtol=0, atol=0)
    assert not torch.allclose(l1[:, 10:], l2[:, 10:])
    assert m.output_weight() is m.embedding.word_embeddings.weight
    assert l1.shape == (2, 16, 256)


def test_attention_equals_torch_sdpa_and_whole_head_layout():
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 8, 5, dtype=torch.float64) for _ in range(3))
    torch.testing.assert_close(causal_attention(q, k, v), F.scaled_dot_product_attention(q, k, v, is_causal=True))
    # Megatron's fused layout: rows [q_h | k_h | v_h] per head, so half the rows = half the heads
    cfg = GPTConfig(hidden_size=16, num_attention_heads=4, seq_length=8)
    attn = GPT(cfg).double().decoder.layers[0].self_attention
    x = torch.randn(2, 8, 16, dtype=torch.float64)
    W, B = attn.linear_qkv.weight, attn.linear_qkv.bias
    qkv = (x @ W.t() + B).view(2, 8, 4, 12).transpose(1, 2)
    q, k, v = qkv.split(4, dim=-1)
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(2, 8, 16)
    torch.testing.assert_close(attn(x), attn.linear_proj(y))


def test_loss_is_mean_cross_entropy_and_dropout_off_by_default():
    m = GPT(seed=3).double()
    t = torch.randint(0, 256, (2, 64))
    y = torch.roll(t, -1, 1)
    m.train()
    a = m.loss(t, y)
    m.eval()
    torch.testing.assert_close(a, m.loss(t, y), rtol=0, atol=0)
    torch.testing.assert_close(a, F.cross_entropy(m(t).reshape(-1, 256), y.reshape(-1)))


@pytest.mark.parametrize("kwargs,msg", [
    (dict(hidden_size=50, num_attention_heads=4), "hidden_size divisible by num_attention_heads.*50 % 4"),
    (dict(num_layers=0), "num_layers must be a positive integer"),
])
def test_config_errors(kwargs, msg):
    with pytest.raises(ValueError, match=msg):
        GPTConfig(**kwargs)
    with pytest.raises(ValueError, match="unknown preset"):
        preset("gpt5")

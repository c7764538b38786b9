"""The dense reference GPT: the single-device model every parallel strategy must match.

It knows nothing about parallelism (no torch.distributed here). Module names follow Megatron-LM
core (``decoder.layers[i].self_attention.linear_qkv`` ...), so a parallelization plan can name the
modules it cuts. Activations are [b, s, h] (batch, sequence, hidden), like nanoGPT; Megatron
itself uses [s, b, h].

GPT-2 architecture (Radford et al. 2019): learned positions, pre-LayerNorm blocks, GELU MLP of
4h, output layer tied to the word embeddings unless ``untie_embeddings_and_output_weights``.
Initialization follows Megatron: N(0, init_method_std) for weights, the two output projections of
each block scaled by 1/sqrt(2 * num_layers), zero biases; drawn on the CPU from one seed in a fixed
order, so every rank builds the same model and then keeps its shard.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class GPTConfig:
    num_layers: int = 2
    hidden_size: int = 64
    num_attention_heads: int = 4
    seq_length: int = 64
    vocab_size: int = 256           # already padded (see labkit.data.padded_vocab_size)
    ffn_hidden_size: int | None = None  # None -> 4 * hidden_size
    init_method_std: float = 0.02
    layernorm_epsilon: float = 1e-5
    hidden_dropout: float = 0.0
    attention_dropout: float = 0.0
    untie_embeddings_and_output_weights: bool = False

    def __post_init__(self):
        for name in ("num_layers", "hidden_size", "num_attention_heads", "seq_length", "vocab_size"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{name} must be a positive integer, got {v!r}")
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(f"hidden_size {self.hidden_size} is not divisible by "
                             f"num_attention_heads {self.num_attention_heads}")
        if self.ffn_hidden_size is None:
            object.__setattr__(self, "ffn_hidden_size", 4 * self.hidden_size)

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    def num_parameters(self) -> int:
        h, f, v, s, L = self.hidden_size, self.ffn_hidden_size, self.vocab_size, self.seq_length, self.num_layers
        per_layer = 2 * 2 * h + (3 * h * h + 3 * h) + (h * h + h) + (h * f + f) + (f * h + h)
        out = 0 if not self.untie_embeddings_and_output_weights else v * h
        return v * h + s * h + L * per_layer + 2 * h + out


# GPT-2 sizes (vocab 50257 padded to 50304, a multiple of 128, as Megatron does)
PRESETS = {
    "tiny": GPTConfig(),
    "gpt2": GPTConfig(num_layers=12, hidden_size=768, num_attention_heads=12, seq_length=1024, vocab_size=50304),
    "gpt2-large": GPTConfig(num_layers=36, hidden_size=1280, num_attention_heads=20, seq_length=1024, vocab_size=50304),
    "gpt2-xl": GPTConfig(num_layers=48, hidden_size=1600, num_attention_heads=25, seq_length=1024, vocab_size=50304),
}
PRESETS["124m"], PRESETS["774m"], PRESETS["1.5b"] = PRESETS["gpt2"], PRESETS["gpt2-large"], PRESETS["gpt2-xl"]


def preset(name: str, **overrides) -> GPTConfig:
    """A named config ("tiny", "gpt2", "gpt2-large", "gpt2-xl"), with fields overridden."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose from {sorted(PRESETS)}")
    return replace(PRESETS[name], **overrides)


# ------------------------------------------------------------------------------------------------
def causal_attention(q, k, v, dropout_p: float = 0.0, training: bool = False):
    """softmax(q k^T / sqrt(d) + causal mask) v.  q, k, v: [b, n_heads, s, d] -> [b, n_heads, s, d]."""
    s, d = q.shape[-2], q.shape[-1]
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(d)                      # [b, n, s, s]
    mask = torch.ones(s, s, dtype=torch.bool, device=q.device).triu(1)       # True above diagonal
    probs = scores.masked_fill(mask, float("-inf")).softmax(dim=-1)
    probs = F.dropout(probs, dropout_p, training)
    return probs @ v


class SelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.head_dim, self.attention_dropout = cfg.head_dim, cfg.attention_dropout
        # Megatron's fused QKV layout: output features grouped per head as [q_h | k_h | v_h], so a
        # contiguous slice of rows (a tensor-parallel shard) holds whole heads.
        self.linear_qkv = nn.Linear(cfg.hidden_size, 3 * cfg.hidden_size)
        self.linear_proj = nn.Linear(cfg.hidden_size, cfg.hidden_size)

    def forward(self, x):                                   # x: [b, s, h]
        b, s, _ = x.shape
        qkv = self.linear_qkv(x)                            # [b, s, 3h] (3h/tp under TP)
        n_heads = qkv.shape[-1] // (3 * self.head_dim)      # heads held by this module
        qkv = qkv.view(b, s, n_heads, 3 * self.head_dim).transpose(1, 2)  # [b, n, s, 3d]
        q, k, v = qkv.split(self.head_dim, dim=-1)
        y = causal_attention(q, k, v, self.attention_dropout, self.training)  # [b, n, s, d]
        y = y.transpose(1, 2).reshape(b, s, n_heads * self.head_dim)
        return self.linear_proj(y)


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.linear_fc1 = nn.Linear(cfg.hidden_size, cfg.ffn_hidden_size)
        self.linear_fc2 = nn.Linear(cfg.ffn_hidden_size, cfg.hidden_size)

    def forward(self, x):                                   # [b, s, h] -> [b, s, h]
        return self.linear_fc2(F.gelu(self.linear_fc1(x)))


class TransformerLayer(nn.Module):
    """Pre-LN block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.hidden_dropout = cfg.hidden_dropout
        self.input_layernorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layernorm_epsilon)
        self.self_attention = SelfAttention(cfg)
        self.pre_mlp_layernorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layernorm_epsilon)
        self.mlp = MLP(cfg)

    def forward(self, x):
        drop = lambda t: F.dropout(t, self.hidden_dropout, self.training)  # noqa: E731
        x = x + drop(self.self_attention(self.input_layernorm(x)))
        return x + drop(self.mlp(self.pre_mlp_layernorm(x)))


class Embedding(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.dropout = cfg.hidden_dropout
        self.word_embeddings = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.position_embeddings = nn.Embedding(cfg.seq_length, cfg.hidden_size)

    def forward(self, tokens):                              # [b, s] int64 -> [b, s, h]
        pos = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.word_embeddings(tokens) + self.position_embeddings(pos)
        return F.dropout(x, self.dropout, self.training)


class Decoder(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.layers = nn.ModuleList(TransformerLayer(cfg) for _ in range(cfg.num_layers))
        self.final_layernorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layernorm_epsilon)


class GPT(nn.Module):
    """``GPT(cfg, seed)(tokens) -> logits`` [b, s, V]; ``.loss(tokens, labels)`` -> mean cross-entropy."""

    def __init__(self, cfg: GPTConfig = GPTConfig(), seed: int = 0):
        super().__init__()
        self.cfg = cfg
        self.embedding = Embedding(cfg)
        self.decoder = Decoder(cfg)
        self.output_layer = (nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
                             if cfg.untie_embeddings_and_output_weights else None)
        self.reset_parameters(seed)

    @torch.no_grad()
    def reset_parameters(self, seed: int) -> None:
        gen = torch.Generator().manual_seed(seed)
        std, out_std = self.cfg.init_method_std, self.cfg.init_method_std / math.sqrt(2 * self.cfg.num_layers)
        for name, p in self.named_parameters():  # fixed order -> same values on every rank
            if name.endswith("layernorm.weight"):
                p.fill_(1.0)
            elif name.endswith("bias"):
                p.zero_()
            else:
                scale = out_std if name.endswith(("linear_proj.weight", "linear_fc2.weight")) else std
                p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float32) * scale)

    def output_weight(self) -> torch.Tensor:
        """[V, h]: the output layer's weight, or the word embeddings when tied."""
        return self.embedding.word_embeddings.weight if self.output_layer is None else self.output_layer.weight

    def forward(self, tokens):                              # [b, s] -> logits [b, s, V]
        x = self.embedding(tokens)
        for layer in self.decoder.layers:
            x = layer(x)
        x = self.decoder.final_layernorm(x)
        return x @ self.output_weight().t()

    def loss(self, tokens, labels):
        """Mean next-token cross-entropy over all b*s positions."""
        return lm_loss(self(tokens), labels)


def lm_loss(logits, labels):
    """logits [b, s, V], labels [b, s] -> scalar mean cross-entropy."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))

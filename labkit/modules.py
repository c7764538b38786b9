"""The building blocks a model spec chooses from (labkit/spec.py), each tagged with its ROLE.

A role is what a parallel plan needs to know about a module to cut it, whatever its class; the
roles, and what each means to every plan, are ONE table: ``labkit.roles.ROLES`` (embedding,
position, norm, qk_norm, qkv, proj, fc1, fc2, output, core_attention, router, expert_fc1, ...).

``role(module, name, **layout)`` sets ``module.role`` (and layout facts a cut needs: ``stack`` = 2
for SwiGLU's fused fc1; ``qkv_layout`` = (heads, groups, head_dim)). The tensor-parallel plan
maps roles to styles (tensor_parallel/plan.py), so an RMSNorm is tagged like a LayerNorm and a
SwiGLU fc1 is cut as [gate_r; up_r]; no plan tests a class. Nothing here imports torch.distributed.
Activations are [b, s, h]; attention works on [b, heads, s, d].
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


def role(module: nn.Module, name: str, **layout) -> nn.Module:
    """Tag ``module`` with its role (and layout facts); returns it."""
    module.role = name
    for k, v in layout.items():
        setattr(module, k, v)
    return module


def roles(model: nn.Module) -> dict[str, str]:
    """{module name: role} of every tagged module of ``model``."""
    return {n: m.role for n, m in model.named_modules() if getattr(m, "role", None)}


class Dropout(nn.Module):
    """Dropout drawing its mask from an explicit ``torch.Generator`` (the RNG seam).

    The dense model gives all its Dropouts one generator; ``labkit.parallelize`` points each at the
    stream Megatron uses for its region (replicated or tensor-parallel). A generator on another
    device than the activations draws there and moves the mask.
    """

    def __init__(self, p: float):
        super().__init__()
        self.p, self.generator = p, None

    def mask(self, x) -> torch.Tensor:
        """The keep-mask for ``x``: bool, x's shape, drawn from this module's generator."""
        gen_device = self.generator.device if self.generator is not None else x.device
        return torch.rand(x.shape, generator=self.generator, device=gen_device) >= self.p

    def forward(self, x):
        if not self.training or self.p == 0.0:
            return x
        return x * self.mask(x).to(x.device, x.dtype) / (1.0 - self.p)


class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * weight (Zhang & Sennrich 2019; Megatron's RMSNorm): no mean, no bias."""

    def __init__(self, hidden_size: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden_size))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def norm(cfg, size: int | None = None, name: str = "norm") -> nn.Module:
    """The spec's normalization over ``size`` (default the hidden size), role ``name`` ("norm"; a
    per-head QK-layernorm is "qk_norm": its gradient is summed over tp, labkit.roles)."""
    size = cfg.hidden_size if size is None else size
    if cfg.normalization == "RMSNorm":
        return role(RMSNorm(size, eps=cfg.layernorm_epsilon), name)
    return role(nn.LayerNorm(size, eps=cfg.layernorm_epsilon), name)


def linear(cfg, n_in: int, n_out: int, name: str, **layout) -> nn.Linear:
    """A linear layer of role ``name``, with a bias unless the spec disables them."""
    return role(nn.Linear(n_in, n_out, bias=cfg.add_bias_linear), name, **layout)


def causal_attention(q, k, v, dropout=None):
    """softmax(q k^T / sqrt(d) + causal mask) v.  q [b, n, s, d]; k, v [b, g, s, d] with g dividing
    n (group-query attention: query head i reads K/V head i // (n/g)) -> [b, n, s, d]."""
    if k.shape[1] != q.shape[1]:
        rep = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    s, d = q.shape[-2], q.shape[-1]
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(d)                      # [b, n, s, s]
    mask = torch.ones(s, s, dtype=torch.bool, device=q.device).triu(1)       # True above diagonal
    probs = scores.masked_fill(mask, float("-inf")).softmax(dim=-1)
    return (probs if dropout is None else dropout(probs)) @ v


class CoreAttention(nn.Module):
    """Causal softmax attention of the local heads: q [b, n, s, d], k, v [b, g, s, d] -> [b, n, s, d]."""

    def __init__(self, attention_dropout: float):
        super().__init__()
        self.attention_dropout = Dropout(attention_dropout)

    def forward(self, q, k, v):
        return causal_attention(q, k, v, self.attention_dropout)


def rotate_half(x):
    """[x1, x2] -> [-x2, x1] on the last dim (Megatron's non-interleaved RoPE, ``_rotate_half``)."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class RotaryEmbedding(nn.Module):
    """RoPE (Su et al. 2021): channel pair (i, i + d/2) of a head rotated by position * base^(-2i/d).

    Applied to q and k at each token's position in the WHOLE sequence: ``position_ids`` [s_local]
    under context parallelism (a rank's two chunks, ``context_parallel.sharding``), else 0..s-1 of
    the sequence the attention sees (under sequence parallelism the full one, after the all-gather).
    """

    def __init__(self, head_dim: int, base: int):
        super().__init__()
        self.head_dim, self.base = head_dim, base

    def cos_sin(self, positions, dtype):
        """cos, sin [s, d] for integer ``positions`` [s] (angles in float64, then ``dtype``)."""
        d = self.head_dim
        inv_freq = self.base ** (-torch.arange(0, d, 2, dtype=torch.float64, device=positions.device) / d)
        angles = positions.to(torch.float64)[:, None] * inv_freq[None, :]       # [s, d/2]
        emb = torch.cat((angles, angles), dim=-1)                                # [s, d]
        return emb.cos().to(dtype), emb.sin().to(dtype)

    def forward(self, q, k, position_ids=None):                # [b, n, s, d], [b, g, s, d]
        if position_ids is None:
            position_ids = torch.arange(q.shape[-2], device=q.device)
        cos, sin = self.cos_sin(position_ids, q.dtype)
        return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


class SelfAttention(nn.Module):
    """Megatron's fused QKV: per query group, [q of its n/g heads | k | v] x head_dim output rows,
    so whole groups are contiguous. ``num_attention_heads`` / ``num_query_groups`` are the heads and
    groups THIS module computes (the tensor-parallel plan sets its own)."""

    def __init__(self, cfg):
        super().__init__()
        n, g, d = cfg.num_attention_heads, cfg.query_groups, cfg.head_dim
        self.num_attention_heads, self.num_query_groups, self.head_dim = n, g, d
        self.linear_qkv = linear(cfg, cfg.hidden_size, (n + 2 * g) * d, "qkv", qkv_layout=(n, g, d))
        qk = cfg.qk_layernorm                               # Megatron's q_layernorm / k_layernorm
        self.q_layernorm = norm(cfg, d, "qk_norm") if qk else None
        self.k_layernorm = norm(cfg, d, "qk_norm") if qk else None
        self.rotary = (RotaryEmbedding(d, cfg.rotary_base) if cfg.position_embedding_type == "rope"
                       else None)
        self.core_attention = role(CoreAttention(cfg.attention_dropout), "core_attention")
        self.linear_proj = linear(cfg, n * d, cfg.hidden_size, "proj")

    def forward(self, x, position_ids=None):               # x: [b, s, h] (s/t under SP)
        qkv = self.linear_qkv(x)                            # [b, s, g*(n/g + 2)*d] (s full under SP)
        b, s, _ = qkv.shape
        n, g, d = self.num_attention_heads, self.num_query_groups, self.head_dim
        qkv = qkv.view(b, s, g, n // g + 2, d)
        q = qkv[:, :, :, :n // g].reshape(b, s, n, d).transpose(1, 2)      # [b, n, s, d]
        k, v = qkv[:, :, :, n // g].transpose(1, 2), qkv[:, :, :, n // g + 1].transpose(1, 2)  # [b, g, s, d]
        if self.q_layernorm is not None:                    # per head, over d, before RoPE (Megatron)
            q, k = self.q_layernorm(q), self.k_layernorm(k)
        if self.rotary is not None:
            q, k = self.rotary(q, k, position_ids)
        y = self.core_attention(q, k, v)                    # [b, n, s, d]
        return self.linear_proj(y.transpose(1, 2).reshape(b, s, n * d))


class MLP(nn.Module):
    """fc2(act(fc1(x))): GeLU, or SwiGLU with fc1 = [gate; up] -> silu(gate) * up (Shazeer 2020).
    Roles ``fc1``/``fc2`` (a routed expert's: ``expert_fc1``/``expert_fc2``)."""

    def __init__(self, cfg, ffn_hidden_size: int | None = None, expert: bool = False):
        super().__init__()
        ffn_hidden_size = ffn_hidden_size or cfg.ffn_hidden_size
        self.swiglu = cfg.swiglu
        stack = 2 if cfg.swiglu else 1
        prefix = "expert_" if expert else ""
        self.linear_fc1 = linear(cfg, cfg.hidden_size, stack * ffn_hidden_size, prefix + "fc1", stack=stack)
        self.linear_fc2 = linear(cfg, ffn_hidden_size, cfg.hidden_size, prefix + "fc2")

    def forward(self, x):                                   # [..., h] -> [..., h]
        y = self.linear_fc1(x)                              # [..., stack * ffn] (/t under TP)
        if self.swiglu:
            gate, up = y.chunk(2, dim=-1)                   # each rank holds [gate_r; up_r]
            y = F.silu(gate) * up
        else:
            y = F.gelu(y)
        return self.linear_fc2(y)

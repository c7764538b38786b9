"""The dense GPT: the single-device model every parallel layout must match, and the ONE forward.

It knows nothing about parallelism (no torch.distributed here). It reads a spec
(``labkit.spec.GPTConfig``: GPT-2 and Llama 3 are two presets of it, not two forwards) and builds
its parts from ``labkit.modules``, each tagged with its role (qkv, proj, fc1, fc2, norm,
embedding, output, ...) for the plans. Its modules carry Megatron-LM core's names
(``decoder.layers.3.self_attention.linear_qkv``), and every place a parallel plan changes is a
module attribute, a *seam*, swapped in place (``labkit.parallelize``):

    embedding.word_embeddings                TP: vocabulary-parallel embedding
    embedding.to_sequence_shard              SP: keep this rank's s/t positions (Identity here)
    decoder.layers.i.self_attention.linear_qkv / linear_proj, mlp.linear_fc1 / linear_fc2
                                             TP: column- / row-parallel linears
    decoder.layers.i.self_attention.core_attention
                                             CP: attention over the sequence shards of all ranks
    output_layer, loss_fn                    TP: vocabulary-parallel logits and cross-entropy
    every Dropout's ``generator``            Megatron's RNG streams per region
    decoder.layers.i.mlp (a MoE layer, labkit/moe.py, when ``num_experts`` is set and the layer is
      one of ``moe_layer_freq``'s): .experts.local_experts, .token_dispatcher, .router
                                             EP: keep E/ep experts, exchange tokens (all-to-all)
    embedding / final norm / output layer    None on pipeline stages that do not hold them

Activations are [b, s, h] (batch, sequence, hidden), like nanoGPT (Megatron uses [s, b, h]).
Pre-norm blocks; GPT-2 (Radford et al. 2019): learned positions, LayerNorm, GeLU MLP of 4h, biases,
output layer tied to the word embeddings; Llama 3 (Dubey et al. 2024): RoPE, RMSNorm, SwiGLU,
group-query attention, no biases, untied. ``position_ids`` (context parallelism's global positions
of a rank's tokens) reach the embedding and every layer's RoPE.
Initialization follows Megatron: N(0, init_method_std) for weights, the two output projections of
each block scaled by 1/sqrt(2 * num_layers), zero biases; drawn on the CPU from one seed in a fixed
order, so every rank builds the same model and then keeps its shard.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from . import roles
from .modules import (MLP, CoreAttention, Dropout, RotaryEmbedding, SelfAttention,  # noqa: F401 - seams
                      causal_attention, norm, role)
from .moe import MoELayer
from .precision import upcast
from .spec import PRESETS, GPTConfig, preset  # noqa: F401 - the model's configuration (the spec)

__all__ = ["GPT", "GPTConfig", "PRESETS", "preset", "causal_attention", "lm_loss"]


def lm_loss(logits, labels):
    """logits [b, s, V], labels [b, s] -> scalar mean cross-entropy (16-bit logits in fp32, as
    Megatron's cross-entropy)."""
    logits = upcast(logits)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))


class TransformerLayer(nn.Module):
    """Pre-norm block: x + dropout(attn(norm(x))), then x + dropout(mlp(norm(x))); the mlp is a
    mixture of experts in MoE layers (``cfg.moe_layers()[layer_number]``). The norm and the MLP's
    activation are the spec's (LayerNorm/RMSNorm, GeLU/SwiGLU)."""

    def __init__(self, cfg: GPTConfig, layer_number: int = 0):
        super().__init__()
        self.input_layernorm = norm(cfg)
        self.self_attention = SelfAttention(cfg)
        self.self_attn_dropout = Dropout(cfg.hidden_dropout)
        self.pre_mlp_layernorm = norm(cfg)
        self.mlp = (role(MoELayer(cfg, layer_number), "moe") if cfg.moe_layers()[layer_number]
                    else role(MLP(cfg, cfg.ffn_hidden_size), "mlp"))
        self.mlp_dropout = Dropout(cfg.hidden_dropout)

    def forward(self, x, position_ids=None):
        x = x + self.self_attn_dropout(self.self_attention(self.input_layernorm(x), position_ids))
        return x + self.mlp_dropout(self.mlp(self.pre_mlp_layernorm(x)))


class Embedding(nn.Module):
    """Word embeddings, plus a learned position table with ``position_embedding_type``
    "learned_absolute" (RoPE and "none" have none: RoPE acts in the attention)."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.word_embeddings = role(nn.Embedding(cfg.vocab_size, cfg.hidden_size), "embedding")
        self.position_embeddings = (role(nn.Embedding(cfg.seq_length, cfg.hidden_size), "position")
                                    if cfg.position_embedding_type == "learned_absolute" else None)
        self.to_sequence_shard = role(nn.Identity(), "sequence_shard")
        self.embedding_dropout = Dropout(cfg.hidden_dropout)

    def forward(self, tokens, position_ids=None):          # [b, s] int64 -> [b, s, h]
        x = self.word_embeddings(tokens)
        if self.position_embeddings is not None:
            if position_ids is None:
                position_ids = torch.arange(tokens.shape[1], device=tokens.device)
            x = x + self.position_embeddings(position_ids)
        return self.embedding_dropout(self.to_sequence_shard(x))


class OutputLayer(nn.Module):
    """logits = x W^T, W [V, h]: its own weight, or (tied) the weight passed in (Megatron's
    ``output_layer(..., weight=shared_embedding_or_output_weight())``)."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        untied = cfg.untie_embeddings_and_output_weights
        self.weight = nn.Parameter(torch.empty(cfg.vocab_size, cfg.hidden_size)) if untied else None

    def forward(self, x, weight=None):                      # [b, s, h] -> [b, s, V]
        return F.linear(x, self.weight if weight is None else weight)


class LMLoss(nn.Module):
    """Mean next-token cross-entropy over the b*s positions of the (micro)batch."""

    def forward(self, logits, labels):
        return lm_loss(logits, labels)


class Layers(nn.ModuleDict):
    """Transformer layers keyed by their global number ("0", "1", ...), so a pipeline stage that
    keeps layers 4-7 still names them ``decoder.layers.4`` like the dense model; ``layers[4]`` works."""

    def __getitem__(self, key):
        return super().__getitem__(str(key))


class Decoder(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.layers = Layers({str(i): TransformerLayer(cfg, i) for i in range(cfg.num_layers)})
        self.final_layernorm = norm(cfg)


class GPT(nn.Module):
    """``GPT(cfg, seed)(tokens) -> logits`` [b, s, V]; ``GPT(...)(tokens, labels)`` -> mean loss."""

    def __init__(self, cfg: GPTConfig = GPTConfig(), seed: int = 0):
        super().__init__()
        self.cfg = cfg
        self.embedding = Embedding(cfg)
        self.decoder = Decoder(cfg)
        self.output_layer = role(OutputLayer(cfg), "output")
        self.loss_fn = role(LMLoss(), "loss")
        self.layer_runner = None    # seam: runs the decoder layers (labkit.recompute swaps it)
        self.tied_to = None         # a part's tied output layer reading another part's embedding (part)
        self.reset_parameters(seed)
        gen = torch.Generator().manual_seed(seed)           # one dropout stream for the dense model
        for m in self.modules():
            if isinstance(m, Dropout):
                m.generator = gen

    @torch.no_grad()
    def reset_parameters(self, seed: int) -> None:
        """Megatron's init, by each parameter's role (``labkit.roles``: normal, scaled or ones; biases
        zero), drawn in parameter order from one generator -> the same values on every rank."""
        gen = torch.Generator().manual_seed(seed)
        std, out_std = self.cfg.init_method_std, self.cfg.init_method_std / math.sqrt(2 * self.cfg.num_layers)
        by_role = roles.of_parameters(self)                 # fails on a parameter with no role
        for name, p in self.named_parameters():
            init = by_role[name].init
            if name.endswith("bias"):
                p.zero_()
            elif init == "ones":
                p.fill_(1.0)
            else:
                scale = out_std if init == "scaled" else std
                p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float32) * scale)

    def part(self, layers, pre_process: bool = True, post_process: bool = True, tied_to=None) -> "GPT":
        """A GPT made of some of this model's modules (shared, not copied): the decoder layers
        numbered ``layers``, the embedding if ``pre_process``, the final norm, output layer and loss
        if ``post_process`` (Megatron's GPTModel arguments of the same names).

        ``tied_to``: the embedding module a tied output layer reads when this part has none, held by
        another part on the same rank (a V placement's rank 0 holds the first and the last stage).
        It is kept out of this part's modules: the weight stays one parameter, of the part with the
        embedding, and autograd adds the output layer's use to its gradient, as on one device."""
        new = GPT.__new__(GPT)
        nn.Module.__init__(new)
        new.cfg = self.cfg
        new.embedding = self.embedding if pre_process else None
        new.decoder = nn.Module()
        new.decoder.layers = Layers({str(i): self.decoder.layers[i] for i in layers})
        new.decoder.final_layernorm = self.decoder.final_layernorm if post_process else None
        new.output_layer = self.output_layer if post_process else None
        new.loss_fn = self.loss_fn if post_process else None
        new.layer_runner = None
        object.__setattr__(new, "tied_to", tied_to)        # not a submodule: not in parameters()
        return new

    def output_weight(self) -> torch.Tensor:
        """The output layer's weight, or the word embeddings when tied (this part's, or ``tied_to``'s)."""
        if self.output_layer.weight is not None:
            return self.output_layer.weight
        return (self.embedding if self.embedding is not None else self.tied_to).word_embeddings.weight

    def used_parameters(self) -> list:
        """The parameters this part's forward reads: its own, and a tied output weight it borrows."""
        own = list(self.parameters())
        if self.output_layer is not None and self.output_layer.weight is None and self.embedding is None:
            own.append(self.output_weight())
        return own

    def forward(self, x, labels=None, position_ids=None):
        """x: tokens [b, s] (a stage with the embedding) or hidden states [b, s, h] (a later
        pipeline stage). Returns hidden states (a stage without the output layer), else logits
        [b, s, V] or, given ``labels``, the loss."""
        if self.embedding is not None:
            x = self.embedding(x, position_ids)             # [b, s] -> [b, s, h]
        if self.layer_runner is None:
            for layer in self.decoder.layers.values():
                x = layer(x, position_ids)                  # [b, s, h]
        else:                                               # e.g. full recomputation
            x = self.layer_runner(list(self.decoder.layers.values()), x, position_ids)
        if self.output_layer is None:                       # not the last pipeline stage
            return x
        x = self.decoder.final_layernorm(x)
        tied = self.output_weight() if self.output_layer.weight is None else None
        logits = self.output_layer(x, tied)                 # [b, s, V] (V/t under TP)
        return logits if labels is None else self.loss_fn(logits, labels)

    def loss(self, tokens, labels):
        """Mean next-token cross-entropy over all b*s positions."""
        return self(tokens, labels)

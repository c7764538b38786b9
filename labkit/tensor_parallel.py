"""Tensor parallelism: every layer's weights cut across the t ranks of the tp group.

Chapter "Tensor parallelism" (Shoeybi et al. 2019, "Megatron-LM", Sec. 3 and Fig. 3; Megatron-LM
``megatron/core/tensor_parallel/layers.py``) and chapter "Sequence parallelism" (Korthikanti et
al. 2022, Sec. 4.2.2).

MLP: Y = GeLU(X A) B.  A [h, 4h] is split by COLUMNS (rank r holds A_r [h, 4h/t]), so GeLU(X A_r)
is computed locally: no communication between the two GEMMs. B [4h, h] is split by ROWS (B_r
[4h/t, h]), so GeLU(X A_r) B_r is a partial sum and one all-reduce finishes it. Attention is the
same with heads: linear_qkv column-parallel (whole heads per rank), linear_proj row-parallel.

The two operators at the borders of a TP region are conjugate (labkit/comm.py):
    f  = copy_to      forward identity        backward all-reduce   (entering: X used by t ranks)
    g  = reduce_from  forward all-reduce      backward identity     (leaving: partial sums)
Under sequence parallelism (``sequence_parallel=True``) activations outside the region are sharded
along the sequence, [b, s/t, h]: f becomes an all-gather (backward reduce-scatter) and g a
reduce-scatter (backward all-gather). Same bytes (labkit.calc.comm.tp_layer_bytes).

Every module here is built ``from_dense(module, group)``: keep this rank's slice of the dense
weights. Parameters carry Megatron's attributes: ``tensor_model_parallel`` (sharded) and
``sequence_parallel`` (replicated but fed sequence shards: its gradient is summed over tp).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from . import comm
from .groups import Group
from .model import causal_attention
from .sequence_parallel import linear_with_sequence_regather, mark_sequence_parallel, sequence_range
from .vocab_parallel import VocabParallelEmbedding, vocab_parallel_cross_entropy


def _divide(n: int, t: int, what: str) -> int:
    if n % t:
        raise ValueError(f"{what} {n} is not divisible by tensor_model_parallel_size {t}")
    return n // t


def _param(t: torch.Tensor, tensor_model_parallel: bool) -> nn.Parameter:
    p = nn.Parameter(t.detach().clone())
    p.tensor_model_parallel = tensor_model_parallel
    return p


class ColumnParallelLinear(nn.Module):
    """Y_r = X A_r + b_r: rank r holds rows [r*out/t, (r+1)*out/t) of the dense weight [out, in].

    Input replicated [b, s, in] (or [b, s/t, in] under SP: all-gathered first); output [b, s, out/t],
    or gathered to [b, s, out] with ``gather_output``.
    """

    def __init__(self, weight, bias, group: Group, gather_output=False, sequence_parallel=False):
        super().__init__()
        self.group, self.gather_output, self.sequence_parallel = group, gather_output, sequence_parallel
        self.weight = _param(weight, True)                                     # [out/t, in]
        self.bias = None if bias is None else _param(bias, True)               # [out/t]

    @classmethod
    def from_dense(cls, linear: nn.Linear, group: Group, **kw):
        out = _divide(linear.out_features, group.size, "output features")
        rows = slice(group.rank * out, (group.rank + 1) * out)
        bias = None if linear.bias is None else linear.bias[rows]
        return cls(linear.weight[rows], bias, group, **kw)

    regather_input = False  # advanced (labkit.sequence_parallel.use_regather): Megatron's saving

    def forward(self, x):
        if self.sequence_parallel and self.regather_input:
            y = linear_with_sequence_regather(self.group, x, self.weight, self.bias)
            return comm.gather_from(self.group, y, -1) if self.gather_output else y
        if self.sequence_parallel:
            x = comm.gather_from_sequence(self.group, x)   # [b, s/t, in] -> [b, s, in]
        else:
            x = comm.copy_to(self.group, x)                # f: identity; backward all-reduce
        y = F.linear(x, self.weight, self.bias)            # [b, s, out/t]: no communication
        return comm.gather_from(self.group, y, -1) if self.gather_output else y


class RowParallelLinear(nn.Module):
    """Y = sum_r X_r B_r + b: rank r holds columns [r*in/t, (r+1)*in/t) of the dense weight [out, in].

    Input [b, s, in/t] (already split: the output of a ColumnParallelLinear); output replicated
    [b, s, out], or [b, s/t, out] under SP. The bias is added once, after the sum.
    """

    def __init__(self, weight, bias, group: Group, sequence_parallel=False):
        super().__init__()
        self.group, self.sequence_parallel = group, sequence_parallel
        self.weight = _param(weight, True)                                     # [out, in/t]
        self.bias = None if bias is None else _param(bias, False)              # [out], replicated
        if self.bias is not None and sequence_parallel:
            self.bias.sequence_parallel = True  # added to a sequence shard: partial gradient

    @classmethod
    def from_dense(cls, linear: nn.Linear, group: Group, **kw):
        cols = _divide(linear.in_features, group.size, "input features")
        w = linear.weight[:, group.rank * cols:(group.rank + 1) * cols]
        return cls(w, linear.bias, group, **kw)

    def forward(self, x):                                  # x: [b, s, in/t]
        partial = F.linear(x, self.weight)                 # [b, s, out]: this rank's share of the sum
        if self.sequence_parallel:
            y = comm.reduce_scatter_to_sequence(self.group, partial)  # [b, s/t, out]
        else:
            y = comm.reduce_from(self.group, partial)      # g: all-reduce; backward identity
        return y if self.bias is None else y + self.bias


class ParallelAttention(nn.Module):
    """Causal self-attention with heads a/t per rank; [b, s, h] -> [b, s, h] (sequence shards under SP)."""

    def __init__(self, linear_qkv: ColumnParallelLinear, linear_proj: RowParallelLinear, head_dim: int):
        super().__init__()
        self.linear_qkv, self.linear_proj, self.head_dim = linear_qkv, linear_proj, head_dim
        self.attention_dropout = 0.0

    @classmethod
    def from_dense(cls, attention, group: Group, sequence_parallel: bool = False):
        """``attention``: a ``labkit.model.SelfAttention``. Heads must divide by t (Megatron's rule)."""
        d = attention.head_dim
        heads = attention.linear_qkv.out_features // (3 * d)
        if heads % group.size:
            raise ValueError(f"num_attention_heads {heads} is not divisible by "
                             f"tensor_model_parallel_size {group.size}: each TP rank needs whole heads")
        # the dense QKV rows are grouped per head as [q_h | k_h | v_h]: a contiguous slice = whole heads
        qkv = ColumnParallelLinear.from_dense(attention.linear_qkv, group, sequence_parallel=sequence_parallel)
        proj = RowParallelLinear.from_dense(attention.linear_proj, group, sequence_parallel=sequence_parallel)
        new = cls(qkv, proj, d)
        new.train(attention.training)
        new.attention_dropout = attention.attention_dropout
        return new

    def forward(self, x):                                  # [b, s, h] (or [b, s/t, h] under SP)
        qkv = self.linear_qkv(x)                           # [b, s, 3h/t]: my a/t heads
        b, s, _ = qkv.shape
        n = qkv.shape[-1] // (3 * self.head_dim)
        q, k, v = qkv.view(b, s, n, 3 * self.head_dim).transpose(1, 2).split(self.head_dim, dim=-1)
        y = causal_attention(q, k, v, self.attention_dropout, self.training)  # [b, a/t, s, d]
        return self.linear_proj(y.transpose(1, 2).reshape(b, s, n * self.head_dim))


class ParallelMLP(nn.Module):
    """linear_fc1 column-parallel, GeLU on the [b, s, 4h/t] shard, linear_fc2 row-parallel."""

    def __init__(self, linear_fc1: ColumnParallelLinear, linear_fc2: RowParallelLinear):
        super().__init__()
        self.linear_fc1, self.linear_fc2 = linear_fc1, linear_fc2

    @classmethod
    def from_dense(cls, mlp, group: Group, sequence_parallel: bool = False):
        return cls(ColumnParallelLinear.from_dense(mlp.linear_fc1, group, sequence_parallel=sequence_parallel),
                   RowParallelLinear.from_dense(mlp.linear_fc2, group, sequence_parallel=sequence_parallel))

    def forward(self, x):
        return self.linear_fc2(F.gelu(self.linear_fc1(x)))  # no communication between the GEMMs


class ParallelEmbedding(nn.Module):
    """Vocab-parallel word embeddings + replicated positions; [b, s] -> [b, s, h] ([b, s/t, h] SP)."""

    def __init__(self, embedding, group: Group, sequence_parallel: bool = False):
        super().__init__()
        self.group, self.sequence_parallel, self.dropout = group, sequence_parallel, embedding.dropout
        self.word_embeddings = VocabParallelEmbedding.from_dense(embedding.word_embeddings, group,
                                                                 sequence_parallel)
        self.position_embeddings = embedding.position_embeddings   # replicated [s, h]
        if sequence_parallel:  # each rank adds only its positions' rows: partial gradient
            self.position_embeddings.weight.sequence_parallel = True

    def forward(self, tokens):                             # [b, s] int64
        x = self.word_embeddings(tokens)                   # [b, s, h], or [b, s/t, h] under SP
        start, end = (sequence_range(tokens.shape[1], self.group.rank, self.group.size)
                      if self.sequence_parallel else (0, tokens.shape[1]))
        x = x + self.position_embeddings(torch.arange(start, end, device=tokens.device))
        return F.dropout(x, self.dropout, self.training)


class TensorParallelGPT(nn.Module):
    """The dense GPT with its layers replaced by their TP shards (built by apply_tensor_parallel).

    ``forward(tokens)`` -> this rank's logits [b, s, V/t]; ``loss(tokens, labels)`` -> the mean
    vocab-parallel cross-entropy of the microbatch, equal on every tp rank.
    """

    def __init__(self, model, group: Group, sequence_parallel: bool = False):
        super().__init__()
        self.cfg, self.group, self.sequence_parallel = model.cfg, group, sequence_parallel
        self.embedding = ParallelEmbedding(model.embedding, group, sequence_parallel)
        self.decoder = model.decoder                      # layers are cut in place, below
        for layer in self.decoder.layers:
            layer.self_attention = ParallelAttention.from_dense(layer.self_attention, group, sequence_parallel)
            layer.mlp = ParallelMLP.from_dense(layer.mlp, group, sequence_parallel)
            if sequence_parallel:
                mark_sequence_parallel(layer)             # the two layer norms
        if sequence_parallel:
            mark_sequence_parallel(self.decoder.final_layernorm)
        self.output_layer = (None if model.output_layer is None else
                             ColumnParallelLinear.from_dense(model.output_layer, group,
                                                             sequence_parallel=sequence_parallel))

    def output_weight(self) -> torch.Tensor:
        """[V/t, h]: this rank's rows of the output layer (the word embeddings when tied)."""
        return (self.embedding.word_embeddings.weight if self.output_layer is None
                else self.output_layer.weight)

    def logits(self, hidden):                              # after the final norm -> [b, s, V/t]
        if self.sequence_parallel:
            hidden = comm.gather_from_sequence(self.group, hidden)  # [b, s/t, h] -> [b, s, h]
        else:
            hidden = comm.copy_to(self.group, hidden)      # f
        return F.linear(hidden, self.output_weight())

    def forward(self, tokens):                             # [b, s] -> [b, s, V/t]
        x = self.embedding(tokens)
        for layer in self.decoder.layers:
            x = layer(x)                                   # the dense block, with parallel parts
        return self.logits(self.decoder.final_layernorm(x))

    def loss(self, tokens, labels):
        """Mean next-token cross-entropy over the b*s positions (vocab-parallel, never gathered)."""
        return vocab_parallel_cross_entropy(self.group, self(tokens), labels).mean()


def apply_tensor_parallel(model, group: Group, sequence_parallel: bool = False) -> TensorParallelGPT:
    """Cut the dense ``labkit.model.GPT`` for this tp rank (its decoder layers are modified in place).

    Raises ValueError when heads, ffn size, padded vocabulary or (under SP) the sequence do not
    divide by the tp size.
    """
    cfg, t = model.cfg, group.size
    _divide(cfg.num_attention_heads, t, "num_attention_heads")
    _divide(cfg.ffn_hidden_size, t, "ffn_hidden_size")
    _divide(cfg.vocab_size, t, "padded vocab_size")
    if sequence_parallel:
        _divide(cfg.seq_length, t, "seq_length (sequence parallel shards the sequence)")
    if t > 1 and (cfg.hidden_dropout > 0 or cfg.attention_dropout > 0):
        # replicated activations need the same mask on every tp rank, TP regions and SP shards
        # different ones: Megatron's CUDA RNG tracker, which labkit does not implement
        raise ValueError(f"dropout (hidden {cfg.hidden_dropout}, attention {cfg.attention_dropout}) "
                         f"with tensor_model_parallel_size {t} needs per-region RNG states: use 0")
    return TensorParallelGPT(model, group, sequence_parallel)


def tp_plan(sequence_parallel: bool = False) -> dict[str, str]:
    """The plan as data, module name -> what apply_tensor_parallel does to it (the book diffs the two)."""
    enter, leave = (("all-gather(seq) -> column", "row -> reduce-scatter(seq)") if sequence_parallel
                    else ("f -> column", "row -> g (all-reduce)"))
    norm = "sequence shard [b, s/t, h]" if sequence_parallel else "replicated [b, s, h]"
    return {"embedding.word_embeddings": "vocab rows V/t -> " + ("reduce-scatter(seq)" if sequence_parallel
                                                                 else "all-reduce"),
            "embedding.position_embeddings": "replicated" + (", rows of my positions" if sequence_parallel else ""),
            "decoder.layers.*.input_layernorm": norm,
            "decoder.layers.*.self_attention.linear_qkv": enter + ", heads a/t",
            "decoder.layers.*.self_attention.linear_proj": leave,
            "decoder.layers.*.pre_mlp_layernorm": norm,
            "decoder.layers.*.mlp.linear_fc1": enter + ", 4h/t",
            "decoder.layers.*.mlp.linear_fc2": leave,
            "decoder.final_layernorm": norm,
            "output_layer": ("all-gather(seq)" if sequence_parallel else "f") + " -> vocab rows V/t",
            "loss": "vocab-parallel cross-entropy (3 collectives of [b, s])"}

"""Vocabulary-parallel embedding and cross-entropy: the [V, h] table cut into V/t rows per TP rank.

Chapter "Tensor parallelism", section "The vocabulary-parallel embedding and loss" (Shoeybi et
al. 2019, Sec. 3; Megatron-LM ``tensor_parallel/layers.py`` VocabParallelEmbedding and
``cross_entropy.py``).

The vocabulary is first padded so it divides evenly (Megatron's ``_vocab_size_with_padding``, here
``labkit.data.padded_vocab_size``: a multiple of ``make_vocab_size_divisible_by * tp``; the byte
vocabulary 256 becomes 512 at TP 4 with the default 128). TP rank r owns rows
[r*V/t, (r+1)*V/t) of the word embeddings, which are also the output layer when they are tied.

* Embedding: each rank looks up the tokens it owns, writes zeros for the others, and the partial
  [b, s, h] results are summed over TP: an all-reduce (f-bar). Under sequence parallelism the
  embedding then adds the positions and keeps this rank's s/t of them (Megatron's path for
  learned absolute positions; ``sequence_parallel.ScatterToSequence``).
* Cross-entropy on logits [b, s, V/t] that are never gathered (gathering would move b*s*V values):
  three small collectives of [b, s] values replace it. The local math lives in plain helpers (tested
  in one process by simulating the ranks in a loop); one autograd Function adds the collectives.
"""
from __future__ import annotations

import torch
from torch import nn

from .. import comm
from ..groups import Group
from ..precision import upcast
from .tp_comm import reduce_from


# ----------------------------------------------------------------------------------------------
# Local math: no communication (each helper is what ONE rank computes)
# ----------------------------------------------------------------------------------------------
def vocab_range(vocab_size: int, rank: int, world_size: int) -> tuple[int, int]:
    """[start, end) of the vocabulary rows owned by ``rank`` of ``world_size``."""
    if vocab_size % world_size:
        raise ValueError(f"vocab_size {vocab_size} is not divisible by tensor_model_parallel_size "
                         f"{world_size}: pad it (labkit.data.padded_vocab_size) as Megatron does")
    per = vocab_size // world_size
    return rank * per, (rank + 1) * per


def local_token_ids(tokens: torch.Tensor, start: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids shifted into this shard ([b, s] -> [b, s]) and the mask of those it does NOT own."""
    outside = (tokens < start) | (tokens >= end)
    return (tokens - start).masked_fill(outside, 0), outside


def target_logits(logits: torch.Tensor, labels: torch.Tensor, start: int, end: int) -> torch.Tensor:
    """logits [b, s, V/t], labels [b, s] -> the label's logit where this rank owns it, else 0 [b, s]."""
    ids, outside = local_token_ids(labels, start, end)
    picked = logits.gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    return picked.masked_fill(outside, 0.0)


def cross_entropy_from_parts(sum_exp, target) -> torch.Tensor:
    """loss = log(sum_j exp(z_j - m)) - (z_label - m), from the GLOBAL [b, s] sums (z - m: logits
    shifted by the global max m; the shift cancels, it only keeps exp() from overflowing)."""
    return torch.log(sum_exp) - target


def cross_entropy_grad(softmax: torch.Tensor, labels: torch.Tensor, start: int, end: int):
    """d loss / d logits on this shard: softmax - one_hot(label), the one-hot only where owned."""
    ids, outside = local_token_ids(labels, start, end)
    one_hot = torch.zeros_like(softmax).scatter_(-1, ids.unsqueeze(-1), 1.0)
    return softmax - one_hot * (~outside).unsqueeze(-1).to(softmax.dtype)


# ----------------------------------------------------------------------------------------------
# The Function that adds the collectives
# ----------------------------------------------------------------------------------------------
class _VocabParallelCrossEntropy(torch.autograd.Function):
    """Forward: per-token loss [b, s] from logits sharded over the vocabulary; backward: local."""

    @staticmethod
    def forward(ctx, group, logits, labels):                 # logits [b, s, V/t], labels [b, s]
        start, end = vocab_range(logits.shape[-1] * group.size, group.rank, group.size)
        # 1. global max for a stable softmax. Megatron all-reduces with MAX; labkit.comm sums, so we
        #    gather the t local maxima ([t*b, s], tiny) and take theirs: the same number.
        local_max = logits.max(dim=-1).values                # [b, s]
        logits_max = comm.all_gather(group, local_max, dim=0).view(group.size, *local_max.shape).amax(0)
        shifted = logits - logits_max.unsqueeze(-1)          # [b, s, V/t]
        # 2. the label's logit lives on exactly one rank: a sum over ranks picks it
        target = comm.all_reduce(group, target_logits(shifted, labels, start, end))
        # 3. the softmax denominator
        exp = shifted.exp()
        sum_exp = comm.all_reduce(group, exp.sum(dim=-1))    # [b, s]
        ctx.save_for_backward(exp.div_(sum_exp.unsqueeze(-1)), labels)  # keep the local softmax
        ctx.range = (start, end)
        return cross_entropy_from_parts(sum_exp, target)

    @staticmethod
    def backward(ctx, grad_loss):                            # grad_loss [b, s]
        softmax, labels = ctx.saved_tensors
        grad = cross_entropy_grad(softmax, labels, *ctx.range)
        return None, grad * grad_loss.unsqueeze(-1), None   # no communication in the backward


def vocab_parallel_cross_entropy(group: Group, logits: torch.Tensor, labels: torch.Tensor):
    """Per-token cross-entropy [b, s] from this rank's logits [b, s, V/t]; equals
    ``F.cross_entropy`` on the gathered [b, s, V] logits (``reduction="none"``)."""
    if group.size == 1:
        return torch.nn.functional.cross_entropy(logits.transpose(1, 2), labels, reduction="none")
    return _VocabParallelCrossEntropy.apply(group, logits, labels)


# ----------------------------------------------------------------------------------------------
class VocabParallelCrossEntropyLoss(nn.Module):
    """The loss seam under TP: mean over the b*s positions of the vocab-parallel cross-entropy."""

    def __init__(self, group: Group):
        super().__init__()
        self.group = group

    def forward(self, logits, labels):                       # [b, s, V/t], [b, s] -> scalar
        return vocab_parallel_cross_entropy(self.group, upcast(logits), labels).mean()   # fp32, as Megatron


class VocabParallelEmbedding(nn.Module):
    """Word embeddings with rows [start, end) on this rank; ``weight`` [V/t, h]; output [b, s, h]
    summed over tp (replicated)."""

    def __init__(self, num_embeddings: int, embedding_dim: int, group: Group, dtype=None, device=None):
        super().__init__()
        self.group, self.num_embeddings = group, num_embeddings
        self.start, self.end = vocab_range(num_embeddings, group.rank, group.size)
        self.weight = nn.Parameter(torch.empty(self.end - self.start, embedding_dim, dtype=dtype,
                                               device=device))

    @classmethod
    def from_dense(cls, embedding: nn.Embedding, group: Group):
        """This rank's rows of the dense table (the shard plan's contiguous V/t)."""
        w = embedding.weight
        new = cls(w.shape[0], w.shape[1], group, dtype=w.dtype, device=w.device)
        with torch.no_grad():
            new.weight.copy_(w[new.start:new.end])
        return new

    def forward(self, tokens):                               # [b, s] int64
        ids, outside = local_token_ids(tokens, self.start, self.end)
        partial = self.weight[ids].masked_fill(outside.unsqueeze(-1), 0.0)  # [b, s, h], partial
        return reduce_from(self.group, partial)                             # [b, s, h]

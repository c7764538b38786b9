"""Token dispatch: send every token to the ranks holding its experts, and bring the results back.

Chapter "Expert parallelism". Megatron-LM ``megatron/core/transformer/moe/token_dispatcher.py``
(commit d98e8a64), the two dispatchers of ``moe_token_dispatcher_type``; each replaces the MoE
layer's ``token_dispatcher`` seam (labkit/moe.py ``LocalDispatcher``) and returns what it would:

AllToAllDispatcher (``MoEAlltoAllTokenDispatcher``), on the ep group (and the expert-tp group):

    permutation 1   rows sorted by expert (so by destination ep rank)          [T k, h]
    split sizes     rows per expert of every rank, exchanged FIRST (all-gather of E counts over
                    etp x ep), so each rank knows what it sends and receives; with padding to
                    capacity every count is C and nothing is exchanged
    all-to-all      rank r sends rows_to[j] rows to ep rank j                 (variable splits)
    [etp > 1]       all-gather-v over etp: every expert-tp rank sees the same tokens
    permutation 2   chunks [source][local expert] -> [local expert][source]
    experts         each local expert on its contiguous chunk
    ... and back: inverse permutation 2, [reduce-scatter-v over etp], all-to-all with the splits
    swapped, inverse permutation 1 weighted by the router probabilities (the combine).

AllGatherDispatcher (``MoEAllGatherTokenDispatcher``), on the etp x ep group: all-gather every
rank's tokens, probabilities and routing map; run the local experts on the tokens routed to them;
inverse-permute into the gathered shape; reduce-scatter back (the sum over ranks is the sum over
experts). Simpler, and it moves every token to every rank: ep - 1 times the all-to-all's rows
over ep ranks for top-k = 1.

Every step is autograd-aware (ep_comm.py), so the backward runs the conjugate collectives.
"""
from __future__ import annotations

import torch
from torch import nn

from .. import comm
from ..groups import Group
from ..moe import permute, row_weights, unpermute
from .ep_comm import all_to_all_autograd, gather_v, reduce_scatter_v


def sort_chunks(x, sizes):
    """Rows of ``x`` in chunks ordered [a][b] (``sizes`` [A, B] rows) -> chunks ordered [b][a]
    (Megatron's ``sort_chunks_by_idxs``); ``sort_chunks(y, sizes.T)`` undoes it."""
    A, B = sizes.shape
    chunks = x.split(sizes.reshape(-1).tolist())
    return torch.cat([chunks[a * B + b] for b in range(B) for a in range(A)])


class AllToAllDispatcher(nn.Module):
    """Permute, all-to-all, (all-gather over etp), sort by local expert, compute, and back."""

    def __init__(self, ep: Group, etp: Group, etp_ep: Group, num_experts: int):
        super().__init__()
        self.ep, self.etp, self.etp_ep = ep, etp, etp_ep
        self.num_experts, self.num_local = num_experts, num_experts // ep.size
        self.lo = ep.rank * self.num_local                  # first local expert's number

    def split_sizes(self, counts, capacity=None):
        """[etp, ep, E] rows every rank of the etp x ep group sends to each expert (Megatron's
        ``num_global_tokens_per_expert``), from this rank's counts [E]."""
        n, E = self.etp_ep.size, self.num_experts
        if capacity is not None:                            # padded to capacity: static, no exchange
            return torch.full((self.etp.size, self.ep.size, E), capacity, dtype=torch.long)
        everyone = comm.all_gather(self.etp_ep, counts.reshape(1, E)) if n > 1 else counts.reshape(1, E)
        return everyone.cpu().reshape(self.ep.size, self.etp.size, E).transpose(0, 1)

    def forward(self, x, probs, routing_map, experts, capacity=None):
        num_tokens = x.shape[0]
        token, counts = permute(routing_map, capacity)                       # permutation 1
        weight = row_weights(probs, routing_map, token, capacity)
        glob = self.split_sizes(counts, capacity)                            # [etp, ep, E]
        local = glob[:, :, self.lo:self.lo + self.num_local]                 # [etp, ep, E_local]
        send = counts.cpu().reshape(self.ep.size, self.num_local).sum(1).tolist()   # to each ep rank
        recv = local[self.etp.rank].sum(1).tolist()                          # from each ep rank
        h = all_to_all_autograd(self.ep, x[token], recv, send)               # [sum(recv), h]
        if self.etp.size > 1:                                                # every etp rank: all rows
            h = gather_v(self.etp, h, local.sum((1, 2)).tolist())
        grid = local.reshape(-1, self.num_local)                             # [(etp, ep), E_local]
        y = experts(sort_chunks(h, grid), local.sum((0, 1)))                 # permutation 2, experts
        y = sort_chunks(y, grid.T.contiguous())                              # inverse permutation 2
        if self.etp.size > 1:
            y = reduce_scatter_v(self.etp, y, local.sum((1, 2)).tolist())
        back = all_to_all_autograd(self.ep, y, send, recv)                   # [T k (or E C), h]
        return unpermute(back, token, weight, num_tokens)                    # combine


class AllGatherDispatcher(nn.Module):
    """All-gather tokens, probabilities and map over etp x ep; local experts; reduce-scatter."""

    def __init__(self, ep: Group, etp_ep: Group, num_experts: int):
        super().__init__()
        self.group = etp_ep
        self.num_local = num_experts // ep.size
        self.lo = ep.rank * self.num_local

    def forward(self, x, probs, routing_map, experts, capacity=None):
        n, num_tokens = self.group.size, x.shape[0]
        sizes = [num_tokens] * n                                    # every rank routes T tokens
        xs = gather_v(self.group, x, sizes)                         # [n T, h]
        ps = gather_v(self.group, probs, sizes)[:, self.lo:self.lo + self.num_local]
        with torch.no_grad():
            ms = comm.all_gather(self.group, routing_map.to(torch.uint8)) if n > 1 else routing_map
        ms = ms[:, self.lo:self.lo + self.num_local].bool()
        cap = None if capacity is None else capacity * n            # C from each of n ranks
        token, counts = permute(ms, cap)
        y = experts(xs[token], counts)
        out = unpermute(y, token, row_weights(ps, ms, token, cap), n * num_tokens)
        return reduce_scatter_v(self.group, out, sizes)             # my tokens, summed over experts

"""The mixture-of-experts MLP of ``labkit.model``, on one device (chapter "Expert parallelism").

A MoE layer replaces the MLP of every ``moe_layer_freq``-th transformer layer (Shazeer et al.
2017; Lepikhin et al. 2020, GShard; Fedus et al. 2021, Switch). For the T tokens of one forward:

    logits = x W_r^T                       [T, E]   the router (no bias)
    probs, routing_map = top-k(logits)     [T, E]   k experts per token, weights summing to 1
    (capacity: each expert keeps at most C = ceil(T k / E * factor) tokens; the rest are dropped)
    y_t = sum_e probs[t, e] * expert_e(x_t)  (+ shared_expert(x_t))

computed as permutation (tokens sorted by expert) -> experts on contiguous chunks -> inverse
permutation weighted by the probabilities. The router's math follows Megatron-LM
``megatron/core/transformer/moe/router.py`` and ``moe_utils.py`` (commit d98e8a64): the same order
(z-loss on the logits, top-k then softmax, or softmax then top-k with ``moe_router_pre_softmax``;
token dropping; the aux loss from a full softmax and the UNDROPPED top-k map), the same formulas
and scaling. Where labkit differs, and why:

* softmax scores only (Megatron also has sigmoid / sqrtsoftplus, expert bias, group-limited top-k);
* "position" dropping keeps the first ``capacity`` tokens in Megatron's [s, b] token order
  (Megatron takes ``topk`` of the 0/1 map, whose tie order is the kernel's); padding to capacity
  fills each expert with copies of token 0 at weight 0 (Megatron: other tokens at weight 0) -
  the same arithmetic, the same rows on the wire;
* capacity is counted over the tokens a rank routes: under TP + SP each tp rank routes its own
  s/tp positions (Megatron's ``apply_router_token_dropping`` on the local tokens), so the layout
  changes which tokens drop; the one-device reference sets ``routing_groups`` = tp to drop the same;
* the router weight is applied at the combine (Megatron's ``unpermute(probs=...)``); Megatron's
  dispatchers multiply inside the expert after the activation (experts.py) - equal in exact math;
* aux-loss gradients: Megatron's ``MoEAuxLossAutoScaler`` keeps the scale (1 / microbatches) in a
  class attribute set by the schedule; here :class:`AttachAuxLoss` takes it from the layer's
  ``aux_loss_scale`` seam, set by the plan (``labkit.expert_parallel``) or the reference.

The communication is a seam: ``token_dispatcher`` (here :class:`LocalDispatcher`, on one device;
``labkit.expert_parallel.dispatch`` swaps in all-to-all / all-gather versions), and the router's
``reduce_tokens_per_expert`` / ``tp_cp_size`` (the sequence-parallel router sums the counts).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .calc.moe import get_capacity
from .modules import MLP, role


class AttachAuxLoss(torch.autograd.Function):
    """Forward: ``x`` unchanged. Backward: ``x``'s gradient, and ``scale`` as the gradient of
    ``aux_loss``: the aux loss joins the backward without joining the reported LM loss (Megatron's
    ``MoEAuxLossAutoScaler``, its scale passed in instead of kept in a class attribute)."""

    @staticmethod
    def forward(ctx, x, aux_loss, scale: float):
        ctx.save_for_backward(aux_loss)
        ctx.scale = scale
        return x

    @staticmethod
    def backward(ctx, grad):
        (aux_loss,) = ctx.saved_tensors
        return grad, torch.ones_like(aux_loss) * ctx.scale, None


def switch_load_balancing_loss(scores, tokens_per_expert, total_tokens, topk: int, num_experts: int,
                               coeff: float):
    """E * coeff / (k T^2) * sum_e (sum_t scores[t, e]) * tokens_per_expert[e]: Switch's f_e P_e
    (Fedus et al. 2021, eq. 4; Megatron's ``switch_load_balancing_loss_func``). ``scores`` [T_local, E]
    are this rank's; counts and T may be the whole microbatch's (sequence parallelism)."""
    return (scores.sum(0) * tokens_per_expert).sum() * (num_experts * coeff / (topk * total_tokens ** 2))


def topk_routing(logits, topk: int, pre_softmax: bool):
    """(probs [T, E] with k non-zeros per row, routing_map [T, E] bool): Megatron's
    ``topk_routing_with_score_function`` with the softmax score."""
    if pre_softmax:
        probs, idx = torch.topk(torch.softmax(logits, dim=-1), topk, dim=1)
    else:
        top, idx = torch.topk(logits, topk, dim=1)
        probs = torch.softmax(top, dim=-1)
    routing_map = torch.zeros_like(logits, dtype=torch.bool).scatter(1, idx, True)
    return torch.zeros_like(logits).scatter(1, idx, probs), routing_map


def token_order(num_tokens: int, seq_shape, device) -> torch.Tensor:
    """Rank of each token (labkit order [b, s] flattened) in Megatron's [s, b] order."""
    b, s = seq_shape
    t = torch.arange(num_tokens, device=device)
    return (t % s) * b + t // s


def drop_tokens(probs, routing_map, capacity: int, policy: str, seq_shape):
    """Keep at most ``capacity`` tokens per expert (Megatron's ``apply_router_token_dropping``):
    the ``capacity`` highest probabilities ("probs") or the first in token order ("position")."""
    num_tokens = probs.shape[0]
    if capacity >= num_tokens:
        return probs, routing_map
    if policy == "probs":
        keep = torch.topk(probs.detach(), capacity, dim=0).indices          # [C, E]
    else:  # earliest first: score routed tokens by how early they come
        early = (num_tokens - token_order(num_tokens, seq_shape, probs.device)).to(probs.dtype)
        keep = torch.topk(routing_map * early[:, None], capacity, dim=0).indices
    mask = torch.zeros_like(routing_map).scatter(0, keep, True) & routing_map
    return probs * mask, mask


class Router(nn.Module):
    """Top-k softmax router with Megatron's load-balancing options (``TopKRouter``)."""

    tp_cp_size = 1  # ranks whose tokens make up one microbatch (sequence parallelism: tp)
    # groups of consecutive positions each capacity is counted over: 1 here; the one-device reference
    # sets tp under SP, where each tp rank routes and drops its own s/tp positions (as Megatron does)
    routing_groups = 1

    def __init__(self, cfg):
        super().__init__()
        self.cfg, self.num_experts, self.topk = cfg, cfg.num_experts, cfg.moe_router_topk
        self.weight = nn.Parameter(torch.empty(cfg.num_experts, cfg.hidden_size))
        self.aux_loss_scale = 1.0   # seam: 1 / microbatches (the schedule's loss scale)
        self.capacity = None        # of the last forward, when capacity-limited
        self.stats = None           # {name: running sum} once statistics are attached (moe_stats.py)

    def reduce_tokens_per_expert(self, counts):
        """Counts of the whole microbatch (identity here; summed over tp under SP)."""
        return counts

    def _record(self, name: str, value) -> None:
        if self.stats is None:          # nobody measures: nothing is kept
            return
        v = value.detach().double() if torch.is_tensor(value) else torch.tensor(float(value), dtype=torch.float64)
        self.stats[name] = self.stats[name] + v if name in self.stats else v

    def forward(self, x, seq_shape):
        """x [T, h] (T = b * s tokens of this rank, [b, s] = ``seq_shape``) -> (probs, routing_map)."""
        cfg = self.cfg
        logits = F.linear(x, self.weight)                                  # [T, E]
        training = self.training and torch.is_grad_enabled()
        if cfg.moe_z_loss_coeff is not None and training:                  # ST-MoE (Zoph et al. 2022)
            lse2 = torch.logsumexp(logits, dim=-1).square().mean()
            self._record("z_loss", lse2)
            logits = AttachAuxLoss.apply(logits, lse2 * (cfg.moe_z_loss_coeff / self.tp_cp_size),
                                         self.aux_loss_scale)
        probs, routing_map = topk_routing(logits, self.topk, cfg.moe_router_pre_softmax)
        if self.stats is not None:
            self._record("tokens_per_expert", routing_map.sum(0))
        if cfg.moe_expert_capacity_factor is not None:
            probs, kept = self._drop(probs, routing_map, seq_shape)
            if self.stats is not None:
                self._record("dropped", routing_map.sum() - kept.sum())
            routing_map = kept
        self._record("routed", x.shape[0] * self.topk)
        coeff = cfg.moe_aux_loss_coeff
        if training and coeff > 0 and cfg.moe_router_load_balancing_type != "none":
            aux = self._aux_loss(logits, seq_shape, coeff)
            self._record("load_balancing_loss", aux / coeff)
            probs = AttachAuxLoss.apply(probs, aux, self.aux_loss_scale)
        return probs, routing_map

    def _drop(self, probs, routing_map, seq_shape):
        """Capacity-limited (probs, routing_map), each of ``routing_groups`` slices of s/g positions
        (of every sequence) dropped on its own, with the capacity of its b * s/g tokens."""
        g, (b, s) = self.routing_groups, seq_shape
        if s % g:
            raise ValueError(f"routing_groups {g} must divide the sequence length {s}")
        per_group = get_capacity(b * (s // g) * self.topk, self.num_experts, self.cfg.moe_expert_capacity_factor)
        self.capacity = g * per_group          # rows per expert when padded to capacity (the dispatcher)
        if g == 1:
            return drop_tokens(probs, routing_map, per_group, self.cfg.moe_token_drop_policy, seq_shape)
        # [b*s, E] in [b, s] order -> g slices [b, s/g, E], each flattened in its own [b, s/g] order
        cut = lambda t: [c.reshape(b * (s // g), -1) for c in t.view(b, s, -1).chunk(g, dim=1)]  # noqa: E731
        parts = [drop_tokens(p, r, per_group, self.cfg.moe_token_drop_policy, (b, s // g))
                 for p, r in zip(cut(probs), cut(routing_map))]
        glue = lambda ts: torch.cat([t.view(b, s // g, -1) for t in ts], dim=1).reshape(b * s, -1)  # noqa: E731
        return glue([p for p, _ in parts]), glue([r for _, r in parts])

    def _aux_loss(self, logits, seq_shape, coeff: float):
        """Megatron's ``_apply_aux_loss`` / ``_apply_seq_aux_loss``: scores from a full softmax,
        counts from its top-k (before any dropping), T = the microbatch's tokens."""
        scores = torch.softmax(logits, dim=-1)                              # [T, E]
        top = torch.zeros_like(scores, dtype=torch.bool).scatter(1, scores.topk(self.topk, dim=1).indices, True)
        if self.cfg.moe_router_load_balancing_type == "aux_loss":
            counts = self.reduce_tokens_per_expert(top.sum(0).to(scores.dtype))
            return switch_load_balancing_loss(scores, counts, scores.shape[0] * self.tp_cp_size,
                                              self.topk, self.num_experts, coeff)
        b, s = seq_shape  # seq_aux_loss: one "expert" column per (sequence, expert), then / b
        per_seq = lambda t: t.view(b, s, -1).transpose(0, 1).reshape(s, -1)  # noqa: E731 [s, b*E]
        counts = self.reduce_tokens_per_expert(per_seq(top).sum(0).to(scores.dtype))
        return switch_load_balancing_loss(per_seq(scores), counts, s * self.tp_cp_size, self.topk,
                                          self.num_experts, coeff) / b


def permute(routing_map, capacity: int | None = None):
    """Permutation 1: (token index of each row [N], rows per expert [E]); rows sorted by expert,
    tokens in order within one (Megatron's ``permute``). With ``capacity``, every expert gets
    exactly ``capacity`` rows, padded with token 0 (weighted 0 at the combine)."""
    expert, token = routing_map.T.nonzero(as_tuple=True)               # expert-major order
    counts = routing_map.sum(0)
    if capacity is None:
        return token, counts
    rows = torch.zeros(routing_map.shape[1], capacity, dtype=token.dtype, device=token.device)
    slot = torch.arange(token.numel(), device=token.device) - (counts.cumsum(0) - counts)[expert]
    rows[expert, slot] = token
    return rows.reshape(-1), torch.full_like(counts, capacity)


def unpermute(y, token, weight, num_tokens: int):
    """Inverse permutation 1: out[t] = sum of the rows of token t, each times its ``weight``."""
    out = y.new_zeros(num_tokens, y.shape[-1])
    return out.index_add(0, token, y * weight[:, None])


def row_weights(probs, routing_map, token, capacity: int | None):
    """The router weight of each permuted row (0 for padding rows)."""
    if capacity is None:
        return probs.T[routing_map.T]                                   # expert-major, as permute
    counts = routing_map.sum(0)
    valid = torch.arange(capacity, device=probs.device)[None, :] < counts[:, None]   # [E, C]
    w = probs.T.gather(1, token.view(-1, capacity))
    return (w * valid).reshape(-1)


class Experts(nn.Module):
    """The routed experts held here, keyed by their global number (``local_experts.5`` on every
    rank that holds expert 5, as Layers keys the transformer layers)."""

    def __init__(self, cfg, expert_ids):
        super().__init__()
        self.local_experts = nn.ModuleDict({str(e): role(MLP(cfg, cfg.moe_ffn_hidden_size, expert=True),
                                                         "expert") for e in expert_ids})

    @property
    def expert_ids(self) -> list[int]:
        return sorted(int(k) for k in self.local_experts)

    def forward(self, x, counts):
        """x [N, h] grouped by expert (ascending number), counts [len(local experts)]."""
        chunks = x.split([int(c) for c in counts])
        return torch.cat([self.local_experts[str(e)](c) for e, c in zip(self.expert_ids, chunks)])


class LocalDispatcher(nn.Module):
    """Every expert on this device: permute, compute, inverse-permute (no communication)."""

    def forward(self, x, probs, routing_map, experts, capacity=None):
        token, counts = permute(routing_map, capacity)
        y = experts(x[token], counts)
        return unpermute(y, token, row_weights(probs, routing_map, token, capacity), x.shape[0])


class MoELayer(nn.Module):
    """The ``mlp`` of a MoE transformer layer: router, experts, optional shared expert."""

    def __init__(self, cfg, layer_number: int = 0):
        super().__init__()
        self.layer_number = layer_number
        self.router = role(Router(cfg), "router")
        self.experts = Experts(cfg, range(cfg.num_experts))
        size = cfg.moe_shared_expert_intermediate_size
        self.shared_experts = MLP(cfg, size) if size else None     # roles fc1/fc2: cut like the MLP
        self.token_dispatcher = LocalDispatcher()
        self.pad_to_capacity = cfg.moe_pad_expert_input_to_capacity

    def forward(self, hidden):                                          # [b, s, h] -> [b, s, h]
        b, s, h = hidden.shape
        x = hidden.reshape(b * s, h)
        # on [b, s, h], so that under TP + SP its column/row-parallel linears gather and scatter the
        # sequence as the dense MLP's do (labkit.tensor_parallel.plan)
        shared = self.shared_experts(hidden).reshape(b * s, h) if self.shared_experts is not None else None
        probs, routing_map = self.router(x, (b, s))
        capacity = self.router.capacity if self.pad_to_capacity else None
        y = self.token_dispatcher(x, probs, routing_map, self.experts, capacity)
        return (y if shared is None else y + shared).view(b, s, h)


def moe_layers(model: nn.Module) -> list[MoELayer]:
    """The MoE layers of a model (or a pipeline stage), in order."""
    return [m for m in model.modules() if isinstance(m, MoELayer)]

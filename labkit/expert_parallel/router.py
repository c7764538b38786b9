"""The router under sequence parallelism: each tp rank routes its own s/t positions.

Chapter "Expert parallelism". With TP + SP (required for MoE with TP, Megatron's ``MoELayer``), the
tokens of one microbatch are spread over the tp ranks, but the load-balancing loss is defined on
the whole microbatch: Megatron sums the per-expert counts over the tp x cp group
(``get_tokens_per_expert_and_token_count(reduce_group=tp_cp_group)`` in ``moe_utils.py``), takes
T = local tokens x tp, and divides the z-loss coefficient by tp (``Router.apply_z_loss``, router.py
@ d98e8a64). Each rank's aux loss is then its tokens' part of the microbatch's loss; the router
weight is tagged ``sequence_parallel`` so its gradient is summed over tp, as Megatron's
``Router.reset_parameters`` tags it. Capacity stays per rank, from its own s/t positions (as in
Megatron): the one-device reference caps the same t slices of each microbatch
(``train_reference(moe_routing_groups=...)``, tp under SP), so it drops the same tokens.
"""
from __future__ import annotations

from .. import comm
from ..groups import Group
from ..moe import Router


class SequenceParallelRouter(Router):
    """A Router whose counts are the microbatch's: summed over the tp group."""

    def __init__(self, cfg, tp: Group):
        super().__init__(cfg)
        self.tp, self.tp_cp_size = tp, tp.size

    @classmethod
    def from_dense(cls, router: Router, tp: Group) -> "SequenceParallelRouter":
        """The same weight (same Parameter), tagged; the same seams and statistics."""
        new = cls(router.cfg, tp)
        new.weight, new.aux_loss_scale, new.stats = router.weight, router.aux_loss_scale, router.stats
        new.train(router.training)
        return new

    def reduce_tokens_per_expert(self, counts):
        return comm.all_reduce(self.tp, counts)

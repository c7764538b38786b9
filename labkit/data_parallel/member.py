"""The interface every data-parallel class offers, as one base class (chapter "Data parallelism").

The Engine (labkit/parallelize.py) and the checkpoints (labkit/checkpoint/holdings.py) speak to a
DP object only through it:

    grad_sync_context(is_last_microbatch)  context for a microbatch's backward (no_sync semantics)
    finish_grad_sync()                     after all microbatches: gradients averaged over dp
    all_reduce_grads(ranges_of, group)     sum some gradients over another group, in place, wherever
                                           this DP keeps them: ``ranges_of(name)`` gives the element
                                           ranges [(lo, hi)] of each parameter's flattened gradient
                                           (the shard plan's ``sum_ranges``: SP norms over tp, a
                                           shared K/V group over tp_kv, tied embeddings over embd)
    grad_sq_sum(ranges_of)                 squared gradients this rank counts (``owned_ranges``)
    scale_grads(coef)                      gradient clipping
    step()                                 optimizer step, then gradients set to None (or zeroed)
    memory, held_bytes()                   bytes of params/grads/optimizer held (at the last sync / now)
    full_parameters(), full_grads()        {name: full tensor}, for parity checks (gathers if sharded)
    names, params, optimizer               the parameters it averages and the optimizer that steps them

and, declared here so that a class leaving them out cannot be built (abc: "Can't instantiate"):

    grads_sharded                          True when each rank holds only a shard of the gradients
                                           (a checkpoint then has every dp rank write its shard)
    checkpoint_views()                     what its optimizer updates, named in the dense model
"""
from __future__ import annotations

import abc

Runs = dict[int, list[tuple[str, int, int, int]]]


class DataParallelMember(abc.ABC):
    """Base of every DP / ZeRO class; a checkpoint refuses any other object (labkit.checkpoint)."""

    zero_stage = 0                   # 1-3 under ZeRO (Megatron's distributed optimizer: 1)

    @property
    @abc.abstractmethod
    def grads_sharded(self) -> bool:
        """True when each dp rank holds only its shard of the gradients (ZeRO-2/3, a distributed
        optimizer); a subclass sets it as a class attribute (or in ``__init__``)."""

    @abc.abstractmethod
    def checkpoint_views(self) -> Runs:
        """{id(optimizer parameter): [(dense name, lo, hi, base)]}: that optimizer parameter's
        elements [base, base + hi - lo) hold elements [lo, hi) of the parameter ``name``
        (flattened). Every tensor the optimizer steps must appear: a checkpoint saves these."""

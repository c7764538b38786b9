"""Stragglers planted on gloo ranks, each selectable by name (``labkit.debug.STRAGGLERS``).

Chapter "When training goes wrong", section "The slow rank". Each scenario slows one rank of a small
run by :data:`DELAY` seconds per step (or every call on one link by :data:`LINK_DELAY`), in one of four ways, on the layout
it needs; nothing in labkit's own code changes (what is patched is patched in the rank's process,
for that run). ``Straggler.expect`` is what ``labkit.debug.stragglers.detect`` must name from the
record of one run (tests/test_debug_stragglers.py proves it does, for each):

    dp_slow_compute        DP2: rank 1 computes 1 s longer per step (a slow GPU, a hot node)
    dp_data_stall          DP2: rank 0's data loader takes 1 s per step
    dp4_slow_compute       DP4: rank 2 computes longer
    tp_dp_slow_compute     TP2 x DP2: rank 1 computes longer (its TP peer waits first, then DP)
    tp_dp_data_stall       TP2 x DP2: rank 3's data loader is slow
    tp_slow_link           TP2 x DP2: the link between ranks 2 and 3 is slow (inside their all-reduce)
    pp_slow_compute        PP2: the last stage (rank 1) computes longer
    pp_slow_link           PP2 x DP2: the pipeline link between ranks 1 and 3 is slow (inside a send)
    ep_router_skew         EP2 (MoE): the router is biased to expert 3 (on rank 1); experts cost
                           time per row, so rank 1's experts work 3 times as long as rank 0's
    ep_slow_compute        EP2 (MoE): rank 0's experts are slow, the router balanced

    record = run_straggler("dp_slow_compute")          # [rank] -> that rank's record
    detect(record)                                     # Finding(rank=1, cause="compute", ...)
"""
from __future__ import annotations

import time
from dataclasses import dataclass

DELAY = 1.0            # seconds per step: above a 2-core machine's jitter at a load of 30
LINK_DELAY = 0.04      # seconds per call (or message batch) on a slow link: every one is slowed
COST_PER_ROW = 0.006   # seconds per row an expert computes (ep_router_skew: compute follows load)
ROUTER_BIAS = 10.0     # added to one expert's logit: it is in every token's top-k

MODEL = dict(num_layers=2, hidden_size=32, num_attention_heads=4, seq_length=16, params_dtype="float32",
             micro_batch_size=2, global_batch_size=8, make_vocab_size_divisible_by=64)
MOE = dict(num_experts=4, moe_router_topk=2, moe_aux_loss_coeff=0.0, moe_token_dispatcher_type="alltoall")


@dataclass(frozen=True)
class Straggler:
    name: str
    doc: str
    world_size: int
    layout: dict
    inject: tuple            # (kind, rank, argument): what is slowed, where
    expect: dict             # {"rank": r, or the link's ranks (sorted), "cause": ...}

    def kwargs(self) -> dict:
        return {"world_size": self.world_size, **MODEL, **self.layout}


class _Armed:
    """Once per step: an injection fires at its first chance after ``begin``, then not again."""

    def __init__(self):
        self.armed = False

    def fire(self) -> bool:
        fired, self.armed = self.armed, False
        return fired


def _sleep_before(module, armed, seconds=DELAY):
    module.register_forward_pre_hook(lambda m, args: time.sleep(seconds) if armed.fire() else None)


def _slow_compute(engine, groups, arg, armed, undo):
    _sleep_before(engine.runner.chunks[0], armed)


def _slow_experts(engine, groups, arg, armed, undo):
    from labkit.moe import Experts
    first = next(m for c in engine.runner.chunks for m in c.modules() if isinstance(m, Experts))
    _sleep_before(first, armed)


def _data_stall(engine, groups, arg, armed, undo):
    import labkit.training as training
    original = training.rank_microbatches

    def slow_loader(*args, **kwargs):                    # the worker looks it up at every step
        time.sleep(DELAY)
        return original(*args, **kwargs)
    training.rank_microbatches = slow_loader
    undo.append(lambda: setattr(training, "rank_microbatches", original))


def _slow_collective_link(engine, groups, axis, armed, undo):
    import torch.distributed as dist
    original, pg = dist.all_reduce, groups[axis].pg

    def all_reduce(*args, **kwargs):                     # this rank's side of the link is slow: every call
        if kwargs.get("group") is pg:
            time.sleep(LINK_DELAY)
        return original(*args, **kwargs)
    dist.all_reduce = all_reduce
    undo.append(lambda: setattr(dist, "all_reduce", original))


def _slow_p2p_link(engine, groups, peer, armed, undo):
    import torch.distributed as dist
    original = dist.batch_isend_irecv

    def batch(ops):                                      # every send to ``peer`` crawls
        if any(o.op is dist.isend and o.peer == peer for o in ops):
            time.sleep(8 * LINK_DELAY)
        return original(ops)
    dist.batch_isend_irecv = batch
    undo.append(lambda: setattr(dist, "batch_isend_irecv", original))


def _router_skew(engine, groups, expert, armed, undo):
    import torch

    import labkit.moe as moe
    from labkit.moe import Experts
    original = moe.topk_routing

    def biased(logits, topk, pre_softmax):               # the router, biased to one expert
        bias = torch.zeros(logits.shape[-1], dtype=logits.dtype, device=logits.device)
        bias[expert] = ROUTER_BIAS
        return original(logits + bias, topk, pre_softmax)
    moe.topk_routing = biased
    undo.append(lambda: setattr(moe, "topk_routing", original))
    for c in engine.runner.chunks:                      # every rank: an expert's time follows its rows
        for m in c.modules():
            if isinstance(m, Experts):
                m.register_forward_pre_hook(lambda mod, args: time.sleep(COST_PER_ROW * args[0].shape[0]))


INJECT = {"compute": _slow_compute, "experts": _slow_experts, "data": _data_stall,
          "collective_link": _slow_collective_link, "p2p_link": _slow_p2p_link, "router": _router_skew}

_TP2DP2 = dict(tensor_model_parallel_size=2)
_EP2 = dict(MOE, expert_model_parallel_size=2)
STRAGGLERS = {s.name: s for s in [
    Straggler("dp_slow_compute", "DP2: rank 1 computes longer", 2, {}, ("compute", 1, None),
              {"rank": 1, "cause": "compute"}),
    Straggler("dp_data_stall", "DP2: rank 0's data loader is slow", 2, {}, ("data", 0, None),
              {"rank": 0, "cause": "data"}),
    Straggler("dp4_slow_compute", "DP4: rank 2 computes longer", 4, {}, ("compute", 2, None),
              {"rank": 2, "cause": "compute"}),
    Straggler("tp_dp_slow_compute", "TP2 x DP2: rank 1 computes longer", 4, _TP2DP2, ("compute", 1, None),
              {"rank": 1, "cause": "compute"}),
    Straggler("tp_dp_data_stall", "TP2 x DP2: rank 3's data loader is slow", 4, _TP2DP2, ("data", 3, None),
              {"rank": 3, "cause": "data"}),
    Straggler("tp_slow_link", "TP2 x DP2: the TP link between ranks 2 and 3 is slow", 4, _TP2DP2,
              ("collective_link", 2, "tp"), {"rank": (2, 3), "cause": "link"}),
    Straggler("pp_slow_compute", "PP2: the last stage computes longer", 2,
              dict(pipeline_model_parallel_size=2), ("compute", 1, None), {"rank": 1, "cause": "compute"}),
    Straggler("pp_slow_link", "PP2 x DP2: the pipeline link between ranks 1 and 3 is slow", 4,
              dict(pipeline_model_parallel_size=2), ("p2p_link", 1, 3), {"rank": (1, 3), "cause": "link"}),
    Straggler("ep_router_skew", "EP2: the router overloads expert 3, on rank 1", 2, _EP2,
              ("router", None, 3), {"rank": 1, "cause": "router"}),
    Straggler("ep_slow_compute", "EP2: rank 0's experts are slow, the router balanced", 2, _EP2,
              ("experts", 0, None), {"rank": 0, "cause": "compute"}),
]}


class Slowdown:
    """``labkit.train(probe=Slowdown(name))``: plant straggler ``name`` (None: none) and record
    the run (:class:`labkit.debug.stragglers.StepClock`); ``end()`` returns the rank's record."""

    def __init__(self, name: str | None):
        if name is not None and name not in STRAGGLERS:
            raise ValueError(f"name must be one of {sorted(STRAGGLERS)} (labkit.debug.STRAGGLERS), got {name!r}")
        self.name = name

    def __call__(self, engine, topo, groups, cfg):
        import torch.distributed as dist

        from .stragglers import StepClock
        self.clock, self.armed, self.undo = StepClock(engine, topo, groups, cfg), _Armed(), []
        if self.name is not None:
            kind, rank, arg = STRAGGLERS[self.name].inject
            if rank is None or rank == dist.get_rank():
                INJECT[kind](engine, groups, arg, self.armed, self.undo)
        return self

    def begin(self, iteration: int) -> None:
        self.armed.armed = True
        self.clock.begin(iteration)

    def end(self) -> dict:
        for fn in self.undo:
            fn()
        return self.clock.end()


def run_straggler(name: str | None, steps: int = 4, seed: int = 0, world_size: int | None = None,
                  **layout) -> list[dict]:
    """Run straggler ``name`` (None: a clean run of ``layout``) on gloo; the record of every rank."""
    import labkit
    if name is None:
        kw = {"world_size": world_size or 2, **MODEL, **layout}
    else:
        kw = STRAGGLERS[name].kwargs() if name in STRAGGLERS else {}
    result = labkit.train(steps=steps, seed=seed, backend="gloo", log_interval=0, probe=Slowdown(name), **kw)
    return [r["probe"] for r in result.ranks]

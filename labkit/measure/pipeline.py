"""Run a pipeline schedule for real on p gloo ranks and measure it (chapters "Pipeline
parallelism" and "Interleaved pipeline", lab "Pipeline parallelism").

    run = measure(schedules.one_f_one_b(2, 8))
    plot.render(run.events, unit="seconds")        # the measured timeline
    run.bubble_fraction, run.peak_activation_bytes

A tiny GPT (labkit.model) is cut into p*v stages the way labkit.train cuts it
(``labkit.parallelize``) and the schedule runs through the one executor
(``labkit.pipeline_parallel.executor``). The first iteration warms up; of the others, the one
that took least time is reported (best of N, as benchmarks do: on a shared machine other
processes stretch some iterations, and a slowed-down stage looks busy, not idle).
Each rank takes its clock zero right after a barrier, so all ranks' events share one time axis
(to within the barrier's skew, well under a millisecond on one machine).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..pipeline_parallel.simulate import Event


@dataclass
class Measurement:
    """One measured iteration: every rank's events (seconds) and what each rank held."""

    events: list[Event]
    bubble_fraction: float                  # idle / busy summed over ranks, as simulate() defines it
    peak_activation_bytes: list[int]        # per rank: most bytes saved for backward at once
    peak_in_flight: list[int]               # per rank: most microbatch-chunks held at once
    activation_bytes: list[dict]            # per rank: {chunk: bytes one microbatch saves}
    losses: list[float]                     # loss of the global batch, per iteration
    grads: list = field(default_factory=list)   # per rank {parameter name: gradient} (if asked)
    p2p_bytes: list[float] = field(default_factory=list)  # per rank: bytes sent, one iteration
    iteration: int = 0                      # which iteration the events are from (fastest)


def bubble_of(events: list[Event]) -> float:
    """Idle time over busy time, summed over ranks, of a timeline (simulated or measured)."""
    p = 1 + max(e.rank for e in events)
    span = max(e.end for e in events) - min(e.start for e in events)
    busy = sum(e.end - e.start for e in events)
    return (p * span - busy) / busy


def measure(schedule, num_layers: int | None = None, hidden_size: int = 64, seq_length: int = 64,
            micro_batch_size: int = 4, iterations: int = 3, return_grads: bool = False,
            params_dtype: str = "float32", seed: int = 0, timeout: float = 120.0) -> Measurement:
    """Run ``schedule`` (one action list per rank, ``labkit.pipeline_parallel.schedules``) on p ranks.

    The schedule is validated first (ValueError before any process starts). ``num_layers``
    defaults to one layer per virtual stage. ``return_grads``: also return each rank's gradients
    after the first iteration, by the dense model's parameter names (the last stage's copy of a
    tied embedding under the embedding's name).
    """
    from ..launcher import launch
    from ..pipeline_parallel.simulate import validate
    p, v, m = validate(schedule)
    num_layers = num_layers or p * v
    if num_layers % (p * v):
        raise ValueError(f"num_layers {num_layers} is not divisible by the p*v = {p}*{v} = "
                         f"{p * v} virtual stages of the schedule")
    args = dict(schedule=schedule, v=v, num_layers=num_layers, hidden_size=hidden_size,
                seq_length=seq_length, micro_batch_size=micro_batch_size, iterations=iterations,
                return_grads=return_grads, params_dtype=params_dtype, seed=seed)
    outs = launch(_worker, p, timeout=timeout, **args)
    per_iteration = [[e for o in outs for e in o["events"][k]] for k in range(len(outs[0]["events"]))]
    span = [max(e.end for e in ev) - min(e.start for e in ev) for ev in per_iteration]
    best = min(range(len(span)), key=span.__getitem__)
    events = sorted(per_iteration[best], key=lambda e: (e.start, e.rank))
    return Measurement(events=events, bubble_fraction=bubble_of(events),
                       peak_activation_bytes=[o["peak_bytes"] for o in outs],
                       peak_in_flight=[o["peak_in_flight"] for o in outs],
                       activation_bytes=[o["activation_bytes"] for o in outs],
                       losses=outs[-1]["losses"], grads=[o["grads"] for o in outs],
                       p2p_bytes=[o["p2p_bytes"] for o in outs], iteration=best + 1)


def _worker(schedule, v, num_layers, hidden_size, seq_length, micro_batch_size, iterations,
            return_grads, params_dtype, seed):
    """One pipeline rank: build and cut the model as labkit.train does, run the schedule
    ``iterations`` times (no optimizer step: every iteration computes the same thing)."""
    import torch
    import torch.distributed as dist

    from .. import data
    from ..config import TrainConfig
    from ..groups import build_groups
    from ..launcher import device, now
    from ..model import GPT
    from ..parallelize import parallelize
    from .activations import SavedTensorMeter

    p, m = len(schedule), 1 + max(a.microbatch for a in schedule[0])
    cfg = TrainConfig(num_layers=num_layers, hidden_size=hidden_size, num_attention_heads=4,
                      seq_length=seq_length, micro_batch_size=micro_batch_size,
                      global_batch_size=m * micro_batch_size, pipeline_model_parallel_size=p,
                      num_layers_per_virtual_pipeline_stage=num_layers // (p * v) if v > 1 else None,
                      params_dtype=params_dtype)
    topo = cfg.topology(p)
    groups = build_groups(topo)
    model = GPT(cfg.model_config(), seed=seed).to(device=device(), dtype=getattr(torch, params_dtype))
    engine = parallelize(model, topo, groups, cfg, seed)
    runner = engine.runner
    runner.meters.append(SavedTensorMeter())    # count saved activations (attached: not in training)
    runner.schedule_fn = lambda p_, m_: schedule
    runner.clock = now                          # timestamps of work done (synchronizes on CUDA)
    tokens, losses, grads, events = data.load_tokens(), [], {}, []
    for it in range(iterations):
        inputs, labels = data.get_batch(tokens, it, m * micro_batch_size, seq_length, seed)
        mbs = [(x.to(device()), y.to(device()))
               for x, y in data.microbatches(inputs, labels, micro_batch_size)]
        for chunk in runner.chunks:
            for prm in chunk.parameters():
                prm.grad = None
        groups["pp"].stats.reset()
        dist.barrier(group=groups["pp"].pg)
        t0 = torch.tensor([now()], dtype=torch.float64)   # one time origin for every rank (one host:
        dist.all_reduce(t0, op=dist.ReduceOp.MIN, group=groups["pp"].pg)   # one monotonic clock)
        loss = runner.forward_backward(mbs, engine.dp, t0=float(t0))
        engine.finalize_grads()                            # the tied-embedding sum, as in training
        total = torch.tensor([loss], dtype=torch.float64, device=device())
        dist.all_reduce(total, group=groups["pp"].pg)  # only the last stage's loss is non-zero
        losses.append(total.item())
        if it > 0 or iterations == 1:  # iteration 0 warms up (allocator, first p2p connections)
            events.append(runner.last_run.events)
        if return_grads and it == 0:
            grads = {engine.plan[n].name: prm.grad.detach().cpu().clone() for chunk in runner.chunks
                     for n, prm in chunk.named_parameters()}
    run = runner.last_run
    return {"events": events, "peak_bytes": run.peak_activation_bytes,
            "peak_in_flight": run.peak_in_flight, "activation_bytes": run.activation_bytes,
            "losses": losses, "grads": grads,
            "p2p_bytes": groups["pp"].stats.bytes.get("send", 0.0)}

"""``labkit.train``: one training loop for any combination of strategies, Megatron-style logs.

    result = labkit.train(world_size=4, steps=5, micro_batch_size=2, global_batch_size=16)
    result.losses      # one float per iteration: the loss of the whole global batch

Configuration uses Megatron-LM's argument names (``labkit.config.TrainConfig``).
``global_batch_size`` defaults to ``micro_batch_size * dp``; when it is larger, each iteration
accumulates gradients over ``num_microbatches = global_batch_size / (micro_batch_size * dp)``
microbatches (under pipeline parallelism the same number is the pipeline's microbatches). The
global batch of iteration i is the same samples for every layout (labkit/data.py), so any run can be
compared with one device (``labkit.reference``). Everything is validated before a process starts: a
bad layout is a ValueError naming the rule (labkit/config.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .config import TrainConfig, train_config
from .preflight import preflight
from .validate import positive_int


@dataclass
class TrainResult:
    losses: list[float]                 # loss of each iteration's global batch
    grad_norms: list[float]
    iteration_ms: list[float]           # wall time per iteration on rank 0 (varies run to run)
    config: TrainConfig
    world_size: int
    ranks: list[dict] = field(default_factory=list)  # per-rank extras (comm stats, ...), rank order
    grads: dict | None = None           # {dense name: gradient after step 1}, if capture_grads
    moe: list[dict] | None = None       # MoE: per iteration, load_balancing_loss, tokens per expert...
    loss_scales: list[float] = field(default_factory=list)   # the loss scale after each iteration
    skipped: list[bool] = field(default_factory=list)        # iterations skipped (a non-finite grad)
    restarts: list[dict] = field(default_factory=list)       # max_restarts: each failure (labkit.restart)
    goodput: dict | None = None                               # max_restarts / faults: wall time by cause


def format_iteration(it: int, steps: int, consumed: int, ms: float, lr: float, gbs: int,
                     loss: float, grad_norm: float, moe: dict | None = None, loss_scale: float = 1.0,
                     skipped: int = 0) -> str:
    """One line in Megatron-LM's training-log format (``training_log`` in
    ``megatron/training/training.py``; data/megatron_log_h200_dp2.txt is a real one). With MoE,
    the auxiliary losses follow ``lm loss`` as Megatron prints them (``load_balancing_loss``)."""
    aux = "".join(f" {k}: {moe[k]:.6E} |" for k in ("load_balancing_loss", "z_loss") if k in (moe or {}))
    return (f" iteration {it:8d}/{steps:8d} | consumed samples: {consumed:12d} | "
            f"elapsed time per iteration (ms): {ms:.1f} | learning rate: {lr:.6E} | "
            f"global batch size: {gbs:5d} | lm loss: {loss:.6E} |{aux} loss scale: {loss_scale:.1f} | "
            + ("" if skipped else f"grad norm: {grad_norm:.3f} | ")
            + f"number of skipped iterations: {skipped:3d} | number of nan iterations:   0 |")


def train(world_size: int = 1, steps: int = 10, seed: int = 0, backend: str = "auto",
          log_interval: int = 1, timeout: float = 600.0, capture_grads: bool = False,
          implementation="labkit", save: str | None = None, save_interval: int | None = None,
          load: str | None = None, async_save: bool = False, probe=None, max_restarts: int = 0,
          faults=None, collective_timeout: float | None = None, **config) -> TrainResult:
    """Train the GPT on ``world_size`` ranks for ``steps`` iterations; see the module docstring.

    ``capture_grads``: also return every parameter's gradient after the run's first iteration
    (averaged, before clipping), reassembled under the dense model's names (for parity tests and labs).
    ``implementation``: "labkit" (this package's strategies), or "native" (or a
    ``labkit.native.NativeOptions``): the same layout through PyTorch's DTensor / FSDP2 /
    pipelining APIs (labkit/native/); or "megatron": through Megatron-Core itself (labkit/megatron/,
    needs requirements-megatron.txt; what it cannot run is a ValueError naming the rule).
    Checkpoints (``labkit.checkpoint``, Megatron's flags): ``save`` a folder, every ``save_interval``
    iterations and at the end (``async_save``: written in the background); ``load`` a folder, any
    layout: ``steps`` counts iterations in total, as ``--train-iters``, so a run loaded at iteration
    2 with ``steps=5`` trains iterations 3-5. ``probe(engine, topo, groups, cfg)``: makes a probe on
    every rank (``labkit.debug``), told ``begin(iteration)`` and ``end()`` (returned in ``ranks``).
    ``max_restarts``: when a rank dies, stop all, relaunch and resume from the last checkpoint in
    ``save``, up to that many times (``labkit.restart``; ``faults``: failures on purpose, or the
    environment's ``LABKIT_FAULTS``); ``result.restarts`` lists the events, ``result.goodput`` the
    wall time by cause. ``collective_timeout``: seconds a collective may wait (launcher's default).
    """
    cfg = train_config(**config)
    positive_int("steps", steps)
    from .native.options import check_native, resolve
    megatron = isinstance(implementation, str) and implementation == "megatron"
    native = None if megatron else resolve(implementation)
    if cfg.fp8 is not None and (megatron or native is not None):
        raise ValueError("fp8 runs on labkit's own implementation (labkit.fp8 emulates the FP8 GEMMs)")
    if megatron:
        from .megatron.options import check_megatron, require_installed
        check_megatron(cfg, world_size)         # a named rule for what Megatron cannot run here
        require_installed()
        if save or load or probe is not None or max_restarts:
            raise ValueError("save, load, probe and max_restarts are labkit's own (implementation='labkit')")
    elif native is None:
        cfg.validate(world_size)  # fails here, before any process starts
    else:
        check_native(cfg, world_size, native)   # and what PyTorch's APIs cannot express
        if save or load or probe is not None or max_restarts:
            raise ValueError("save, load, probe and max_restarts are labkit's own (implementation='labkit'); "
                             "PyTorch's native run has its own torch.distributed.checkpoint")
    from . import restart
    from .checkpoint.run import check_arguments
    restart.check(max_restarts, save)
    planned = restart.faults_of(faults, save) if native is None and not megatron else []
    ckpt = check_arguments(cfg, steps, save, save_interval, load, async_save)
    rank_bytes = preflight(cfg, world_size, seed, log_interval)   # the data, seed, memory per rank
    if cfg.data_path is not None:
        _check_data(cfg)      # a corrupt file or a token outside the vocabulary, named here
    from .launcher import launch, under_torchrun
    fn, extra = _worker, (ckpt, probe)
    if native is not None:
        from .native.run import worker as fn
        extra = (native, format_iteration)
    elif megatron:
        from .megatron.run import worker as fn
        extra = (format_iteration,)
    kw = dict(backend=backend, timeout=timeout, rank_memory_bytes=rank_bytes)
    if collective_timeout is not None:
        kw["collective_timeout"] = collective_timeout
    if under_torchrun() and planned:            # torchrun --max-restarts relaunches; --load resumes
        extra = (dict(ckpt, faults=planned), probe)
    if not (max_restarts or planned) or under_torchrun():
        outs = launch(fn, world_size, cfg, steps, seed, log_interval, capture_grads, *extra, **kw)
        return _result(outs, cfg, world_size, capture_grads)
    args = (cfg, steps, seed, log_interval, capture_grads)
    return _with_restarts(launch, world_size, args, kw, (save, save_interval, load, async_save), planned, probe,
                          max_restarts)


def _with_restarts(launch, world_size, args, kw, ckpt_args, planned, probe, max_restarts) -> TrainResult:
    """``labkit.restart``: launch until the run ends, relaunching from ``save`` after a failure;
    the result's per-iteration lists from rank 0's record (each iteration once, the last run of it)."""
    from . import restart
    from .checkpoint.run import check_arguments
    cfg, steps, seed, log_interval, capture_grads = args
    save, save_interval, load, async_save = ckpt_args
    recorder = restart.Recorder()

    def launch_once(load_now):
        c = dict(check_arguments(cfg, steps, save, save_interval, load_now, async_save), faults=planned, report=True)
        return launch(_worker, world_size, *args, c, probe, on_message=recorder, **kw)
    outs, events, walls = restart.run(launch_once, save, load, max_restarts, recorder)
    result = _result(outs, cfg, world_size, capture_grads)
    kept = [recorder.iterations[k] for k in sorted(recorder.iterations)]
    result.losses, result.grad_norms = [m["loss"] for m in kept], [m["grad_norm"] for m in kept]
    result.iteration_ms, result.loss_scales = [m["s"] * 1e3 for m in kept], [m["scale"] for m in kept]
    result.skipped = [m["skipped"] for m in kept]
    if result.moe is not None:
        result.moe = [m["moe"] for m in kept]
    result.restarts, result.goodput = events, restart.account(recorder, walls, events)
    return result


def _result(outs, cfg, world_size, capture_grads) -> TrainResult:
    grads = None
    if capture_grads:
        from .parallelize import assemble
        grads = assemble([o["grads"] for o in outs])
    r0 = outs[0]
    return TrainResult(r0["losses"], r0["grad_norms"], r0["iteration_ms"], cfg, world_size,
                       [o["extra"] for o in outs], grads, r0.get("moe"), r0["loss_scales"], r0["skipped"])


def build_rank(cfg: TrainConfig, seed: int = 0, zero_classes: dict | None = None, topo=None):
    """On every rank of a launch: (topology, groups, Engine) for ``cfg``, the model built, cut in
    the fixed order (labkit.parallelize) and its counters reset (training traffic only).
    ``zero_classes``: {ZeRO stage: DP class} replacing the runtime's (the memory lab's comparison).
    ``topo``: the Topology of a ``cfg`` its caller validated (labkit.train: once per launch, before
    any process starts); None: validate here (the measurements and tests that build ranks)."""
    import torch
    import torch.distributed as dist

    from .groups import build_groups
    from .launcher import device
    from .model import GPT
    from .parallelize import parallelize
    from .precision import params_dtype

    topo = cfg.validate(dist.get_world_size()) if topo is None else topo
    groups = build_groups(topo, embedding_ranks=cfg.embedding_ranks())
    model = GPT(cfg.model_config(), seed=seed).to(device=device(), dtype=params_dtype(cfg))
    engine = parallelize(model, topo, groups, cfg, seed, zero_classes)
    for g in groups.values():
        g.stats.reset()
    return topo, groups, engine


def _check_data(cfg: TrainConfig) -> None:
    """Open ``cfg.data_path`` (a corrupt or truncated file is a ValueError naming it) and check
    that its tokens fit the model's vocabulary, before any process starts."""
    from .indexed_dataset import read_indexed_dataset
    ds = read_indexed_dataset(cfg.data_path)
    vocab = cfg.model_config().vocab_size
    top = int(ds.tokens.max()) if len(ds.tokens) else 0
    if top >= vocab:
        raise ValueError(f"{cfg.data_path}.bin holds token id {top}, but the model's vocabulary has "
                         f"{vocab} entries (labkit's byte tokenizer: 256, padded)")


def rank_microbatches(cfg: TrainConfig, topo, iteration: int, seed: int, tokens,
                      num_samples: int | None = None) -> list:
    """This rank's microbatches of iteration ``iteration``'s global batch, on its device.

    The global batch comes from ``tokens`` (the corpus, ``labkit.data.get_batch``), or, when
    ``cfg.data_path`` is set, from that indexed dataset (``labkit.indexed_dataset.get_batch``:
    Megatron's GPTDataset with ``seed`` and ``num_samples`` = train_iters x global batch)."""
    import torch.distributed as dist

    from . import data
    from .launcher import device
    if cfg.data_path is None:
        inputs, labels = data.get_batch(tokens, iteration, cfg.global_batch(topo), cfg.seq_length, seed)
    else:
        from .indexed_dataset import get_batch
        inputs, labels = get_batch(cfg.data_path, iteration, cfg.global_batch(topo), cfg.seq_length,
                                   seed, num_samples)
    dp_rank = topo.coords(dist.get_rank())["dp"]
    return [(x.to(device()), y.to(device()))
            for x, y in data.microbatches(inputs, labels, cfg.micro_batch_size, topo.dp, dp_rank)]


def _worker(cfg: TrainConfig, steps: int, seed: int, log_interval: int, capture_grads: bool,
            ckpt: dict | None = None, probe=None) -> dict:
    """Runs on every rank: build, cut, (load), train, (save); rank 0 streams Megatron-format lines."""
    import time

    import torch.distributed as dist

    from . import data, moe_stats
    from .expert_parallel.metrics import step_metrics
    from .restart import maybe_fail
    from .launcher import now, send_to_parent
    from .parallelize import dense_shards

    topo, groups, engine = build_rank(cfg, seed, topo=cfg.topology(dist.get_world_size()))  # train() validated
    for chunk in engine.runner.chunks:      # Megatron logs the MoE values: keep the routers' statistics
        moe_stats.attach(chunk)
    rank, gbs = dist.get_rank(), cfg.global_batch(topo)
    tokens = data.load_tokens() if cfg.data_path is None else None   # else: cfg.data_path
    losses, norms, times, grads, moe, scales, skipped = [], [], [], [], [], [], []
    from .checkpoint.run import resume
    start, saver = resume(ckpt, engine, cfg, topo, seed)    # (0, None) without checkpoints
    probe = probe(engine, topo, groups, cfg) if probe is not None else None
    report, faults = bool((ckpt or {}).get("report")), (ckpt or {}).get("faults")
    if saver is not None and faults:
        saver.fault = lambda iteration: maybe_fail(faults, rank, iteration, "save")
    for it in range(start, steps):
        maybe_fail(faults, rank, it, "step")                # labkit.restart: a failure on purpose
        if probe is not None:
            probe.begin(it)
        wall0 = time.time()
        t0 = now()                                          # synchronizes a CUDA device first
        mbs = rank_microbatches(cfg, topo, it, seed, tokens, num_samples=steps * gbs)
        before = engine.skipped_iterations
        loss, grad_norm = engine.step(mbs, capture_grads=capture_grads and it == start)
        times.append((now() - t0) * 1e3)
        scales.append(engine.loss_scale)
        skipped.append(engine.skipped_iterations > before)
        losses.append(loss)
        norms.append(grad_norm)
        moe.append(step_metrics(engine.runner.chunks, groups, cfg, topo))   # None without MoE
        if capture_grads and it == start:
            grads = dense_shards(engine, "grads")
        if rank == 0 and log_interval and ((it + 1) % log_interval == 0 or it + 1 == steps):
            send_to_parent(format_iteration(it + 1, steps, (it + 1) * gbs, times[-1], cfg.lr, gbs,
                                            loss, grad_norm, moe[-1], scales[-1], int(skipped[-1])))
        if report and rank == 0:                            # labkit.restart keeps the record
            send_to_parent({"labkit.iteration": it + 1, "loss": loss, "grad_norm": grad_norm, "s": times[-1] / 1e3,
                            "t0": wall0, "scale": scales[-1], "skipped": skipped[-1], "moe": moe[-1]})
        if saver is not None and (it + 1) % (ckpt["save_interval"] or steps) == 0:
            _save(saver, it + 1, gbs, report and rank == 0)
    if saver is not None and steps > start and steps % (ckpt["save_interval"] or steps):
        _save(saver, steps, gbs, report and rank == 0)      # Megatron saves at the end too
    extra = {"coords": topo.coords(rank), "start": start,
             "checkpoint": saver.finish() if saver is not None else None,
             "probe": probe.end() if probe is not None else None,
             "comm": {axis: g.stats.snapshot() for axis, g in groups.items()},
             # bytes of params/grads/optimizer held at the last step's gradient sync (data_parallel/)
             "memory": engine.dp.memory}
    return {"losses": losses, "grad_norms": norms, "iteration_ms": times, "extra": extra,
            "grads": grads, "moe": moe if cfg.num_experts is not None else None,
            "loss_scales": scales, "skipped": skipped}


def _save(saver, iteration: int, gbs: int, report: bool) -> None:
    """A checkpoint; rank 0 tells the caller how long it blocked training (labkit.restart)."""
    saver.save(iteration, iteration * gbs)
    if report:
        from .launcher import send_to_parent
        send_to_parent({"labkit.save": iteration, "blocking_s": saver.timings[-1]["blocking_s"]})

"""One training run through Megatron-Core itself, on every rank: what ``labkit.train(...,
implementation="megatron")`` launches (chapter "One layout, three implementations").

    build    parallel_state from labkit's Topology, GPTModel chunks (local spec), Megatron's
             DistributedDataParallel, its optimizer; labkit's dense weights copied in (weights.py)
    step     ``get_forward_backward_func()`` over the rank's microbatches (no pipelining, 1F1B or
             interleaved 1F1B), ``finalize_model_grads`` at its end, ``optimizer.step()``

Each iteration is the same global batch as ``labkit.train`` and ``labkit.reference`` cut the same
way (microbatch j of dp rank r, r = Megatron's data-parallel rank). The loss a microbatch returns is
its mean over tokens; the schedule divides it by the number of microbatches and Megatron's DDP
averages over dp, so the gradient is the global batch's mean, as the reference's.
The rank's collectives are counted (``count.py``) during forward, backward and the gradient sync.
"""
from __future__ import annotations

import torch
import torch.distributed as dist


def _forward_step(data_iterator, model):
    """Megatron's ``forward_step_func`` contract: (output, loss_func). GPTModel with labels returns
    the per-token loss [b, s]; the loss function gives the microbatch's mean."""
    tokens, labels = next(data_iterator)
    b, s = tokens.shape
    position_ids = torch.arange(s, device=tokens.device).unsqueeze(0).expand(b, s)
    out = model(tokens, position_ids, None, labels=labels)

    def loss_func(per_token):
        loss = per_token.sum() / per_token.numel()
        return loss, {"lm loss": loss.detach().clone()}     # the schedule divides loss in place
    return out, loss_func


def _step(cfg, topo, chunks, tcfg, optimizer, microbatches, counter):
    """One iteration: forward-backward (+ finalize) counted, then Megatron's optimizer step.
    Returns (this rank's mean microbatch loss or None, grad norm)."""
    from megatron.core.pipeline_parallel import get_forward_backward_func
    for c in chunks:
        c.zero_grad_buffer()
    optimizer.zero_grad()
    m = len(microbatches)
    iters = [iter(microbatches) for _ in chunks]
    with counter:
        losses = get_forward_backward_func()(
            forward_step_func=_forward_step, data_iterator=iters if len(chunks) > 1 else iters[0],
            model=chunks if len(chunks) > 1 else chunks[0], num_microbatches=m,
            seq_length=cfg.seq_length, micro_batch_size=cfg.micro_batch_size, forward_only=False)
    loss = sum(float(d["lm loss"]) for d in losses) / m if losses else None
    return loss, optimizer


def worker(cfg, steps: int, seed: int, log_interval: int, capture_grads: bool, log_line=None,
           capture_params: bool = False, negative_control: bool = False, batch_p2p: bool = False) -> dict:
    """Runs on every rank (``labkit.launch``): the same return value as ``labkit.training._worker``.
    ``capture_params``: the weights after the last step too (the distributed optimizer's check).
    ``negative_control``: the SP norms left untagged (Megatron's torch norm as shipped).
    ``batch_p2p``: an interleaved pipeline's p2p batched (TransformerConfig's default, not
    Megatron-LM's: the reproducer of the pp = 2 swap)."""
    from megatron.core import parallel_state as ps
    from megatron.core.distributed import finalize_model_grads

    from .. import data
    from ..launcher import device, now, send_to_parent
    from ..model import GPT
    from ..native.run import local_microbatches
    from .build import SPTorchNorm, build_model, build_optimizer, init_parallel_state
    from .count import MegatronByteCounter
    from .cpu_standins import cpu_standins
    from .weights import dense_grads, dense_params, load

    dtype, dev = getattr(torch, cfg.params_dtype), device()    # dev: cuda:LOCAL_RANK under NCCL
    topo = cfg.topology(dist.get_world_size())    # validated once by the caller (check_megatron)
    with cpu_standins():
        SPTorchNorm.tag = not negative_control
        init_parallel_state(cfg, topo)
        try:
            chunks, tcfg = build_model(cfg, dtype, batch_p2p, dev)
            load(chunks, GPT(cfg.model_config(), seed=seed).to(dtype))
            tcfg.finalize_model_grads_func = finalize_model_grads
            tcfg.no_sync_func = [c.no_sync for c in chunks] if len(chunks) > 1 else chunks[0].no_sync
            optimizer = build_optimizer(cfg, chunks)
            counter = MegatronByteCounter(axis_groups())
            tokens = data.load_tokens() if cfg.data_path is None else None
            gbs, dp_rank = cfg.global_batch(topo), ps.get_data_parallel_rank()
            losses, norms, times, grads = [], [], [], None
            for it in range(steps):
                t0 = now()
                mbs = [(x.to(dev), y.to(dev)) for x, y in
                       local_microbatches(cfg, topo, dp_rank, it, seed, tokens, steps * gbs)]
                loss, _ = _step(cfg, topo, chunks, tcfg, optimizer, mbs, counter)
                if capture_grads and it == 0:     # distributed optimizer: each rank holds the
                    # sum of its shard only (reduce-scattered); compare parameters instead
                    grads = [] if cfg.use_distributed_optimizer else dense_grads(chunks)
                ok, norm, _ = optimizer.step()
                losses.append(_global_loss(loss, topo, dev))
                norms.append(float(norm))
                times.append((now() - t0) * 1e3)
                if dist.get_rank() == 0 and log_line is not None and log_interval and (it + 1) % log_interval == 0:
                    send_to_parent(log_line(it + 1, steps, (it + 1) * gbs, times[-1], cfg.lr, gbs,
                                            losses[-1], norms[-1]))
            params = dense_params(chunks) if capture_params else None
            coords = {"tp": ps.get_tensor_model_parallel_rank(), "pp": ps.get_pipeline_model_parallel_rank(),
                      "dp": dp_rank}
        finally:
            ps.destroy_model_parallel()
            SPTorchNorm.tag = True
    extra = {"coords": coords, "comm": counter.table(), "memory": None, "implementation": "megatron",
             "params": params}
    return {"losses": losses, "grad_norms": norms, "iteration_ms": times, "extra": extra,
            "grads": grads, "moe": None, "loss_scales": [1.0] * steps, "skipped": [False] * steps}


def axis_groups() -> dict:
    """{labkit's axis name: Megatron's process group} for the byte counter (first name wins when
    two axes are the same group, e.g. dp and dp_cp without CP)."""
    from megatron.core import parallel_state as ps
    out = {"tp": ps.get_tensor_model_parallel_group(), "pp": ps.get_pipeline_model_parallel_group(),
           "dp": ps.get_data_parallel_group(), "ep": ps.get_expert_model_parallel_group(),
           "etp": ps.get_expert_tensor_parallel_group(), "edp": ps.get_expert_data_parallel_group()}
    embd = ps.get_embedding_group(check_initialized=False)   # None on a middle stage (pp > 2)
    if ps.get_pipeline_model_parallel_world_size() > 1 and embd is not None:
        out["embd"] = embd
    return out


def _global_loss(loss, topo, dev) -> float:
    """The global batch's loss on every rank: the mean microbatch loss of each dp replica (its last
    pipeline stage, TP rank 0), summed over the world, / dp (a bookkeeping all-reduce, not counted)."""
    from megatron.core import parallel_state as ps
    mine = loss if loss is not None and ps.get_tensor_model_parallel_rank() == 0 else 0.0
    t = torch.tensor([float(mine)], dtype=torch.float64, device=dev)
    dist.all_reduce(t)
    return float(t) / topo.dp

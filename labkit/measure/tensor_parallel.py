"""One transformer layer, dense vs cut over t ranks: outputs, gradients, bytes and saved activations.

The measurement of the chapters "Tensor parallelism" and "Sequence parallelism" and of the TP lab
(and of tests/test_tensor_parallel.py): the dense ``labkit.model.TransformerLayer`` and a copy cut by
the same plan labkit.train uses (``tensor_parallel.plan.tp_plan``), in float64 by default.
"""
from __future__ import annotations


def _shard_of(param, dense_grad, r: int, t: int):
    """The slice of a dense gradient that tp rank r holds (by the parameter's partition_dim)."""
    if getattr(param, "tensor_model_parallel", False):
        return dense_grad.chunk(t, dim=param.partition_dim)[r]
    return dense_grad


def _block_worker(sequence_parallel: bool, dtype: str, cfg_kw: dict, micro_batch_size: int, seed: int,
                  regather: bool = False):
    import copy

    import torch

    from labkit import comm
    from labkit.groups import world_group
    from labkit.launcher import device
    from labkit.measure.activations import saved_activations
    from labkit.model import GPTConfig, TransformerLayer
    from labkit.tensor_parallel.plan import apply_plan, tp_plan
    from labkit.tensor_parallel.sequence_parallel import use_regather

    group, dev, dt = world_group(), device(), getattr(torch, dtype)
    t, r = group.size, group.rank
    cfg = GPTConfig(**cfg_kw)
    gen = torch.Generator().manual_seed(seed)
    dense = TransformerLayer(cfg).to(dt)
    with torch.no_grad():  # every parameter random, biases and norms included, so none hides a bug
        for p in dense.parameters():
            p.copy_(torch.randn(p.shape, generator=gen, dtype=dt) * 0.2 + (p.dim() == 1) * 0.5)
    dense = dense.to(dev)
    cut = apply_plan(copy.deepcopy(dense), tp_plan(sequence_parallel), group)
    if regather:
        use_regather(cut)
    b, s, h = micro_batch_size, cfg.seq_length, cfg.hidden_size
    x = torch.randn(b, s, h, generator=gen, dtype=dt).to(dev).requires_grad_()
    dy = torch.randn(b, s, h, generator=gen, dtype=dt).to(dev)
    dense(x).backward(dy)
    lo, hi = (r * s // t, (r + 1) * s // t) if sequence_parallel and t > 1 else (0, s)
    xr = x.detach()[:, lo:hi].clone().requires_grad_()     # [b, s/t, h] under SP, else [b, s, h]
    saved, y = saved_activations(cut, xr, exclude=list(cut.parameters()))
    y.backward(dy[:, lo:hi])
    comm_fwd_bwd = group.stats.snapshot()                  # the layer's own traffic
    with torch.no_grad():                                  # what the Engine does after backward
        for p in cut.parameters():
            if getattr(p, "sequence_parallel", False):
                p.grad.copy_(comm.all_reduce(group, p.grad))
    pairs = {"output": (y, dense(x)[:, lo:hi]), "input grad": (xr.grad, x.grad[:, lo:hi])}
    dense_grads = dict(dense.named_parameters())
    for name, p in cut.named_parameters():
        pairs[name + " grad"] = (p.grad, _shard_of(p, dense_grads[name].grad, r, t))
    return {"pairs": {k: (a.detach().cpu(), e.detach().cpu()) for k, (a, e) in pairs.items()},
            "comm": comm_fwd_bwd, "saved_bytes": saved.total_bytes, "saved": saved.table()}


def block_parity(tp: int, sequence_parallel: bool = False, dtype: str = "float64", seq_length: int = 16,
                 hidden_size: int = 32, num_attention_heads: int = 4, micro_batch_size: int = 2,
                 seed: int = 0, backend: str = "gloo", regather: bool = False) -> list[dict]:
    """Run one TransformerLayer dense and cut over ``tp`` ranks; per rank (rank order): ``pairs``
    {what: (tp value, dense value)} for the output, the input gradient and every parameter's
    gradient (the matching dense slice), ``comm`` (bytes and calls of the forward + backward) and
    the activations saved for the backward (``saved_bytes``, ``saved`` [(bytes, shape)]).
    ``regather``: SP with Megatron's re-gathering GEMMs (``sequence_parallel.use_regather``)."""
    from labkit.launcher import launch
    cfg_kw = dict(num_layers=1, hidden_size=hidden_size, num_attention_heads=num_attention_heads,
                  seq_length=seq_length, vocab_size=256)
    return launch(_block_worker, tp, sequence_parallel, dtype, cfg_kw, micro_batch_size, seed, regather,
                  backend=backend, timeout=120.0)

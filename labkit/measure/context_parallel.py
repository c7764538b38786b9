"""Context parallelism measured: one layer dense vs cut over c ranks, bytes, activations, work balance.

The instruments of the chapter "Context parallelism", its lab and tests/test_context_parallel.py:

* :func:`block_parity` - a ``labkit.model.TransformerLayer`` (every parameter random, float64) and
  copies whose core attention is context-parallel (``context_parallel.plan``), for several CP sizes,
  comm types and layouts in ONE launch (CP 2 runs on sub-groups of the CP 4 world): output, input
  gradient and every weight gradient against the dense layer, the bytes of the forward and of the
  backward apart, the activations saved for the backward, the attention work of each rank;
* :func:`itemized_activation_bytes` - what that layer saves on one rank, item by item (exact);
* :func:`work_balance` - ring attention forward + backward per rank, contiguous vs load-balanced:
  FLOPs counted in the code path and host seconds.
The gpt2-xl table of data/cp_gpt2xl_h100.csv against labkit.calc is in ``cp_table.py``.
"""
from __future__ import annotations

VARIANTS = tuple((cp, kind, layout) for cp in (2, 4) for kind, layout in
                 (("p2p", "balanced"), ("p2p", "contiguous"), ("all_gather", "balanced"), ("a2a", "balanced")))


def _sub(snap_after: dict, snap_before: dict) -> dict:
    """{op: bytes} sent between two ``CommStats.snapshot()``s."""
    return {op: v["bytes"] - snap_before.get(op, {}).get("bytes", 0.0) for op, v in snap_after.items()
            if v["bytes"] - snap_before.get(op, {}).get("bytes", 0.0) > 0}


def _layer_worker(variants, cfg_kw: dict, micro_batch_size: int, seed: int):
    import copy

    import torch
    import torch.distributed as dist

    from labkit import comm
    from labkit.context_parallel.plan import apply_context_parallel
    from labkit.context_parallel.sharding import shard
    from labkit.groups import new_group, uncounted, world_group
    from labkit.launcher import device
    from labkit.measure.activations import saved_activations
    from labkit.model import GPTConfig, TransformerLayer

    world, dev, dt = dist.get_world_size(), device(), torch.float64
    groups = {world: world_group()}
    for cp in sorted({v[0] for v in variants} - {world}):   # every rank builds every sub-group
        for start in range(0, world, cp):
            g = new_group("cp", range(start, start + cp))
            if dist.get_rank() in g.ranks:
                groups[cp] = g
    cfg = GPTConfig(**cfg_kw)
    gen = torch.Generator().manual_seed(seed)
    dense = TransformerLayer(cfg).to(dt)
    with torch.no_grad():  # every parameter random, biases and norms included, so none hides a bug
        for p in dense.parameters():
            p.copy_(torch.randn(p.shape, generator=gen, dtype=dt) * 0.2 + (p.dim() == 1) * 0.5)
    dense = dense.to(dev)
    b, s, h = micro_batch_size, cfg.seq_length, cfg.hidden_size
    x = torch.randn(b, s, h, generator=gen, dtype=dt).to(dev).requires_grad_()
    dy = torch.randn(b, s, h, generator=gen, dtype=dt).to(dev)
    y_dense = dense(x)
    y_dense.backward(dy)
    out = {}
    for cp, kind, layout in variants:
        group = groups[cp]
        r = group.rank
        cut = copy.deepcopy(dense)
        apply_context_parallel(cut, group, kind, layout, pattern="self_attention.core_attention")
        xr = shard(x.detach(), r, cp, layout).clone().requires_grad_()     # [b, s/c, h]
        before = group.stats.snapshot()
        saved, y = saved_activations(cut, xr, exclude=list(cut.parameters()))
        mid = group.stats.snapshot()
        y.backward(shard(dy, r, cp, layout))
        after = group.stats.snapshot()
        sums = uncounted(group)                              # the Engine's dp x cp sum, not counted
        pairs = {"output": (y, shard(y_dense, r, cp, layout)), "input grad": (xr.grad, shard(x.grad, r, cp, layout))}
        dense_grads = dict(dense.named_parameters())
        for name, p in cut.named_parameters():
            pairs[name + " grad"] = (comm.all_reduce(sums, p.grad), dense_grads[name].grad)
        work = cut.self_attention.core_attention.work
        out[(cp, kind, layout)] = {
            "pairs": {k: (a.detach().cpu(), e.detach().cpu()) for k, (a, e) in pairs.items()},
            "forward": _sub(mid, before), "backward": _sub(after, mid),
            "saved_bytes": saved.total_bytes, "saved": saved.table(),
            "work": {"flops": work.flops, "blocks": work.blocks}}
    return out


def block_parity(variants=VARIANTS, seq_length: int = 16, hidden_size: int = 32, num_attention_heads: int = 4,
                 micro_batch_size: int = 2, seed: int = 0, backend: str = "gloo") -> dict:
    """{(cp, cp_comm_type, layout): [per rank {"pairs": {what: (cut, dense)}, "forward"/"backward":
    {op: bytes}, "saved_bytes", "saved" [(bytes, shape)], "work" {"flops", "blocks"}}]} for one
    TransformerLayer (float64). Weight gradients are summed over the CP group first (what the
    Engine's dp x cp reduction does, here without the 1/c of the mean loss)."""
    from labkit.launcher import launch
    world = max(v[0] for v in variants)
    cfg_kw = dict(num_layers=1, hidden_size=hidden_size, num_attention_heads=num_attention_heads,
                  seq_length=seq_length, vocab_size=256)
    ranks = launch(_layer_worker, world, list(variants), cfg_kw, micro_batch_size, seed,
                   backend=backend, timeout=120.0)
    return {v: [ranks[r][v] for r in range(v[0])] for v in variants}   # the CP group of rank 0


def itemized_activation_bytes(seq_length, micro_batch_size, hidden_size, num_attention_heads, cp=1,
                              cp_comm_type="p2p", bytes_per_element=8) -> dict:
    """What labkit's TransformerLayer saves for the backward on one CP rank, item by item (TP 1,
    dropout 0). Everything but attention is per token: s/c tokens. The ring and the all-gather
    variant keep q, k, v, the output and the log-sum-exp of the rank's tokens (never the scores);
    a2a keeps the dense attention's softmax [b, a/c, s, s] and its s x s causal mask."""
    s, b, h, a, c, e = seq_length, micro_batch_size, hidden_size, num_attention_heads, cp, bytes_per_element
    t = b * s // c                                          # tokens on this rank
    items = {"layer norm inputs (2)": 2 * t * h * e, "layer norm mean and rstd (2 x 2)": 4 * t * e,
             "linear_qkv and linear_fc1 inputs": 2 * t * h * e, "Q, K, V": 3 * t * h * e,
             "linear_proj input": t * h * e, "GeLU input": 4 * t * h * e, "linear_fc2 input": 4 * t * h * e}
    if c > 1 and cp_comm_type in ("p2p", "all_gather", "allgather"):
        items["attention output (kept by the CP Function)"] = t * h * e
        items["log-sum-exp"] = t * a * e
    else:                                                   # dense attention: all s keys, a/c heads
        items["softmax output"] = b * (a // c) * s * s * e
        items["causal mask (bool)"] = s * s
    return items


def _balance_worker(layouts, shape, repeats: int, seed: int):
    import torch

    from labkit.context_parallel.blockwise import Work
    from labkit.context_parallel.ring_attention import ring_attention
    from labkit.groups import world_group

    group = world_group()
    gen = torch.Generator().manual_seed(seed + group.rank)
    q, k, v, dout = (torch.randn(*shape, generator=gen) for _ in range(4))
    out = {}
    for layout in layouts:
        best = None
        for _ in range(repeats):                            # the fastest of a few: least disturbed
            work = Work()
            qr, kr, vr = (t.clone().requires_grad_() for t in (q, k, v))
            ring_attention(group, qr, kr, vr, layout, True, work).backward(dout)
            best = work if best is None or work.seconds < best.seconds else best
        out[layout] = {"flops": best.flops, "blocks": best.blocks, "seconds": best.seconds}
    return out


def work_balance(cp: int = 4, seq_length: int = 2048, num_heads: int = 4, head_dim: int = 32,
                 micro_batch_size: int = 1, layouts=("contiguous", "balanced"), repeats: int = 3,
                 seed: int = 0, backend: str = "gloo") -> dict:
    """{layout: [per rank {"flops", "blocks", "seconds"}]}: ring attention (forward + backward,
    causal) on each rank's s/c tokens. FLOPs and blocks are counted where the blocks are computed
    (``blockwise.Work``); seconds are host time around that computation, the fastest of
    ``repeats`` runs (ranks share the CPU cores, so times are indicative; FLOPs are exact)."""
    from labkit.launcher import launch
    shape = (micro_batch_size, num_heads, seq_length // cp, head_dim)
    ranks = launch(_balance_worker, cp, list(layouts), shape, repeats, seed, backend=backend, timeout=300.0)
    return {layout: [r[layout] for r in ranks] for layout in layouts}

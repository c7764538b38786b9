"""Tier 2: labkit.comm collectives on gloo ranks — values, byte counters, p2p; and the autograd
conjugate pairs built on them (tensor_parallel/tp_comm.py, expert_parallel/ep_comm.py)."""
import pytest
import torch

import labkit


def sizes_and_backends(*sizes):
    """(n, gloo) always; (n, nccl) with one GPU per rank when the machine has them, else skipped."""
    return [p for n in sizes for p in (pytest.param(n, "gloo", id=f"{n}-gloo"),
                                       pytest.param(n, "nccl", id=f"{n}-nccl", marks=pytest.mark.gpu(devices=n)))]


def _collectives(n_el):
    import torch
    import torch.distributed as dist
    from labkit import comm
    from labkit.groups import world_group
    from labkit.launcher import device
    g, r, n = world_group(), dist.get_rank(), dist.get_world_size()
    x = torch.arange(n_el, dtype=torch.float64, device=device()) + 100 * r  # rank r: 100r + [0..n_el)
    out = {
        "all_reduce": comm.all_reduce(g, x),
        "mean": comm.all_reduce(g, x, op="mean"),
        "all_gather": comm.all_gather(g, x),
        "reduce_scatter": comm.reduce_scatter(g, x),
        "all_to_all": comm.all_to_all(g, x),
        "broadcast": comm.broadcast(g, x, src=n - 1),
        "input_unchanged": torch.equal(x.cpu(), torch.arange(n_el, dtype=torch.float64) + 100 * r),
    }
    out = {k: v.cpu() if torch.is_tensor(v) else v for k, v in out.items()}
    out["stats"] = g.stats.snapshot()
    return out


@pytest.mark.parametrize("n,backend", sizes_and_backends(1, 2, 4))
def test_collectives_values_and_textbook_bytes(n, backend):
    n_el = 8
    outs = labkit.launch(_collectives, n, n_el, backend=backend)
    xs = [torch.arange(n_el, dtype=torch.float64) + 100 * r for r in range(n)]
    total = sum(xs)
    N = n_el * 8  # bytes of one rank's tensor
    for r, o in enumerate(outs):
        assert o["input_unchanged"]
        torch.testing.assert_close(o["all_reduce"], total, rtol=0, atol=0)
        torch.testing.assert_close(o["mean"], total / n, rtol=0, atol=0)
        torch.testing.assert_close(o["all_gather"], torch.cat(xs), rtol=0, atol=0)
        torch.testing.assert_close(o["reduce_scatter"], total.chunk(n)[r], rtol=0, atol=0)
        torch.testing.assert_close(o["all_to_all"], torch.cat([x.chunk(n)[r] for x in xs]), rtol=0, atol=0)
        torch.testing.assert_close(o["broadcast"], xs[n - 1], rtol=0, atol=0)
        s = o["stats"]
        if n == 1:
            assert s == {}
            continue
        assert s["all_reduce"] == {"calls": 2, "bytes": 2 * 2 * (n - 1) / n * N}
        assert s["all_gather"]["bytes"] == (n - 1) / n * (n * N)     # N_full = n * N
        assert s["reduce_scatter"]["bytes"] == (n - 1) / n * N
        assert s["all_to_all"]["bytes"] == (n - 1) / n * N
    # chain broadcast from the last rank: everyone but the rank before it in the ring forwards N
    if n > 1:
        senders = [r for r, o in enumerate(outs) if "broadcast" in o["stats"]]
        assert senders == [r for r in range(n) if r != n - 2]


def _conjugates(n_el):
    """Forward and backward of every autograd pair against the dense math they stand for."""
    import torch
    import torch.distributed as dist
    from labkit.expert_parallel import ep_comm
    from labkit.groups import world_group
    from labkit.launcher import device
    from labkit.tensor_parallel import tp_comm
    g, r = world_group(), dist.get_rank()
    gen = torch.Generator().manual_seed(r)
    res = {}
    for name in ["copy_to", "reduce_from", "scatter_to", "gather_from", "scatter_to_sequence",
                 "gather_from_sequence", "reduce_scatter_to_sequence", "all_to_all_autograd"]:
        x = torch.randn(2 * g.size, 4 * g.size, 4 * g.size, dtype=torch.float64, generator=gen)
        x = x.to(device()).requires_grad_()
        fn = getattr(ep_comm if name == "all_to_all_autograd" else tp_comm, name)
        y = fn(g, x)
        dy = torch.randn(y.shape, dtype=torch.float64, generator=gen).to(device())
        y.backward(dy)
        res[name] = tuple(t.detach().cpu() for t in (x, y, dy, x.grad))
    return res


@pytest.mark.parametrize("n,backend", sizes_and_backends(2, 4))
def test_autograd_pairs_are_conjugate(n, backend):
    outs = labkit.launch(_conjugates, n, 4, backend=backend)
    X = {k: [o[k][0] for o in outs] for k in outs[0]}
    DY = {k: [o[k][2] for o in outs] for k in outs[0]}
    cat = lambda ts, d: torch.cat(ts, dim=d)  # noqa: E731
    for r, o in enumerate(outs):
        def check(name, y, dx):
            torch.testing.assert_close(o[name][1], y, rtol=1e-12, atol=1e-12)
            torch.testing.assert_close(o[name][3], dx, rtol=1e-12, atol=1e-12)
        check("copy_to", X["copy_to"][r], sum(DY["copy_to"]))
        check("reduce_from", sum(X["reduce_from"]), DY["reduce_from"][r])
        check("scatter_to", X["scatter_to"][r].chunk(n, -1)[r], cat(DY["scatter_to"], -1))
        check("gather_from", cat(X["gather_from"], -1), DY["gather_from"][r].chunk(n, -1)[r])
        check("scatter_to_sequence", X["scatter_to_sequence"][r].chunk(n, 1)[r], cat(DY["scatter_to_sequence"], 1))
        check("gather_from_sequence", cat(X["gather_from_sequence"], 1),
              sum(DY["gather_from_sequence"]).chunk(n, 1)[r])
        check("reduce_scatter_to_sequence", sum(X["reduce_scatter_to_sequence"]).chunk(n, 1)[r],
              cat(DY["reduce_scatter_to_sequence"], 1))
        a2a_y = cat([x.chunk(n, 0)[r] for x in X["all_to_all_autograd"]], 0)
        a2a_dx = cat([dy.chunk(n, 0)[r] for dy in DY["all_to_all_autograd"]], 0)
        check("all_to_all_autograd", a2a_y, a2a_dx)


def _p2p():
    import torch
    import torch.distributed as dist
    from labkit import comm
    from labkit.groups import world_group
    g, r, n = world_group(), dist.get_rank(), dist.get_world_size()
    got = []
    for step, shape in enumerate([(3,), (2, 5), (1, 2, 3)]):  # shapes vary: the receiver learns them
        x = torch.full(shape, float(10 * r + step))
        if r % 2 == 0:
            comm.send(g, x, (r + 1) % n)
            got.append(comm.recv(g, (r - 1) % n))
        else:
            got.append(comm.recv(g, (r - 1) % n))
            comm.send(g, x, (r + 1) % n)
    ring = comm.send_recv(g, torch.tensor([float(r)]), dst=(r + 1) % n, src=(r - 1) % n)
    ints = torch.tensor([r], dtype=torch.int64)
    if r == 0:
        comm.send(g, ints, 1)
    elif r == 1:
        ints = comm.recv(g, 0)
    return [t.tolist() for t in got], ring.item(), ints.dtype, g.stats.snapshot()


def test_p2p_varying_shapes_and_ring_exchange():
    n = 4
    outs = labkit.launch(_p2p, n)
    for r, (got, ring, dtype, stats) in enumerate(outs):
        src = (r - 1) % n
        assert got == [[float(10 * src)] * 3, [[float(10 * src + 1)] * 5] * 2, [[[float(10 * src + 2)] * 3] * 2]]
        assert ring == float(src)
        assert stats["send"]["bytes"] == (3 + 10 + 6) * 4 + 4 + (8 if r == 0 else 0)
    assert outs[1][2] == torch.int64


def test_reduce_scatter_rejects_indivisible():
    def f():
        import torch
        from labkit import comm
        from labkit.groups import world_group
        comm.reduce_scatter(world_group(), torch.ones(3))
    with pytest.raises(labkit.launcher.RankFailed, match="not divisible by 2"):
        labkit.launch(f, 2)


def _named_exchange(planted: bool):
    import torch
    import torch.distributed as dist
    from labkit import comm
    from labkit.groups import world_group
    g, r = world_group(), dist.get_rank()
    x = torch.full((2, 3), float(r))
    if r == 0:
        comm.exchange(g, sends=[(x, 1, (0, 1, 7)), (x + 1, 1, (0, 1, 8))])
        return None
    expect = [(0, (0, 1, 8 if planted else 7), (2, 3), torch.float32), (0, (0, 1, 8), (2, 3), torch.float32)]
    return [t.tolist() for t in comm.exchange(g, recvs=expect)]


def test_exchange_names_each_message_and_catches_the_wrong_order():
    """The pipeline's p2p: two messages to one peer in one batch arrive in posting order, and a
    receiver expecting another message than the one that came raises (NCCL would not notice)."""
    _, got = labkit.launch(_named_exchange, 2, False)
    assert got == [[[0.0] * 3] * 2, [[1.0] * 3] * 2]
    with pytest.raises(labkit.launcher.RankFailed, match=r"p2p order mismatch: from group rank 0 "
                                                         r"expected message \(0, 1, 8\), got \(0, 1, 7\)"):
        labkit.launch(_named_exchange, 2, True)

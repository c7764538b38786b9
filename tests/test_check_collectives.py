"""Tier 2: the Collectives lab's checks pass a correct ring and FAIL, with a useful line, otherwise.

Each student function below is a plausible mistake; every test asserts the verdict AND that the
printed line names what is wrong (so a check that always passed, or failed with a useless message,
would fail here). Correct solutions are written here independently of the lab's solution cells.
Bytes and collectives are counted on the process group itself (labkit.check.instrument), so a
collective called through torch.distributed fails like one called through labkit.comm.
"""
import pytest

from labkit.check import collectives as C


# ------------------------------------------------------------------ correct rings (independent)
def ring_all_reduce_ok(group, x):
    from labkit import comm
    n, r = group.size, group.rank
    chunks = [c.clone() for c in x.chunk(n)]
    for step in range(n - 1):                     # reduce-scatter: add what comes from the left
        send_i, recv_i = (r - step) % n, (r - step - 1) % n
        chunks[recv_i] += comm.send_recv(group, chunks[send_i], (r + 1) % n, (r - 1) % n)
    for step in range(n - 1):                     # all-gather: copy what comes from the left
        send_i, recv_i = (r + 1 - step) % n, (r - step) % n
        chunks[recv_i] = comm.send_recv(group, chunks[send_i], (r + 1) % n, (r - 1) % n)
    return torch_cat(chunks)


def torch_cat(chunks):
    import torch
    return torch.cat(chunks)


def ring_all_gather_ok(group, x):
    from labkit import comm
    n, r = group.size, group.rank
    out = [None] * n
    out[r] = x
    for step in range(n - 1):
        send_i, recv_i = (r - step) % n, (r - step - 1) % n
        out[recv_i] = comm.send_recv(group, out[send_i], (r + 1) % n, (r - 1) % n)
    return torch_cat(out)


# ------------------------------------------------------------------ plausible mistakes
def all_reduce_copies_instead_of_adding(group, x):
    from labkit import comm
    n, r = group.size, group.rank
    chunks = [c.clone() for c in x.chunk(n)]
    for step in range(n - 1):
        send_i, recv_i = (r - step) % n, (r - step - 1) % n
        chunks[recv_i] = comm.send_recv(group, chunks[send_i], (r + 1) % n, (r - 1) % n)  # bug
    for step in range(n - 1):
        send_i, recv_i = (r + 1 - step) % n, (r - step) % n
        chunks[recv_i] = comm.send_recv(group, chunks[send_i], (r + 1) % n, (r - 1) % n)
    return torch_cat(chunks)


def all_reduce_send_everything(group, x):
    """Right values, not a ring: every rank sends its whole x to every other rank."""
    from labkit import comm
    n, r = group.size, group.rank
    total = x.clone()
    for k in range(1, n):
        total += comm.send_recv(group, x, (r + k) % n, (r - k) % n)
    return total


def all_reduce_calls_the_collective(group, x):
    from labkit import comm
    return comm.all_reduce(group, x)


def all_gather_calls_torch(group, x):
    import torch
    import torch.distributed as dist
    out = torch.empty(group.size * x.numel(), dtype=x.dtype, device=x.device)
    dist.all_gather_into_tensor(out, x, group=group.pg)
    return out


def all_gather_wrong_order(group, x):
    """Appends chunks in arrival order instead of placing them by source rank."""
    from labkit import comm
    n, r = group.size, group.rank
    got, current = [x], x
    for _ in range(n - 1):
        current = comm.send_recv(group, current, (r + 1) % n, (r - 1) % n)
        got.append(current)
    return torch_cat(got)


def all_gather_send_everything(group, x):
    """Right values, not a ring: gathers the world on rank 0 then sends all of it back."""
    from labkit import comm
    n, r = group.size, group.rank
    if r == 0:
        full = torch_cat([x] + [comm.recv(group, j) for j in range(1, n)])
        for j in range(1, n):
            comm.send(group, full, j)
        return full
    comm.send(group, x, 0)
    return comm.recv(group, 0)


def crashes(group, x):
    if group.rank == 2:
        raise ZeroDivisionError("student bug on rank 2")
    return x


def hangs(group, x):
    from labkit import comm
    return comm.recv(group, (group.rank + 1) % group.size)  # everyone waits, nobody sends


def returns_nothing(group, x):
    ring_all_reduce_ok(group, x)


# ------------------------------------------------------------------ tests
@pytest.mark.parametrize("world", [2, 4])
def test_correct_rings_pass(world, capsys):
    assert C.ring_all_reduce(ring_all_reduce_ok, world_size=world)
    assert C.ring_all_gather(ring_all_gather_ok, world_size=world)
    out = capsys.readouterr().out
    assert out.count("[check] PASS") == 2, out
    assert f"ring_all_reduce ({world} ranks)" in out


def test_wrong_sum_fails_and_names_the_element(capsys):
    result = C.ring_all_reduce(all_reduce_copies_instead_of_adding)
    assert not result
    assert "element" in result.message and "expected" in result.message
    assert "the values differ" in result.hint and "ADD" not in result.hint   # what differs, not how
    assert "[check] FAIL ring_all_reduce" in capsys.readouterr().out


def test_all_reduce_that_is_not_a_ring_fails_on_bytes():
    result = C.ring_all_reduce(all_reduce_send_everything)
    assert not result
    # 4 ranks x 24 float64 = 192 bytes; sent 3 x 192 = 576, a ring sends 2 x 3/4 x 192 = 288
    assert "sent 576 bytes" in result.message and "288" in result.message, result.message


def test_calling_the_collective_is_not_the_exercise():
    # labkit.comm's collectives (and torch.distributed's) raise while the student's code runs
    result = C.ring_all_reduce(all_reduce_calls_the_collective)
    assert not result
    assert "your code called labkit's own implementation: labkit.comm.all_reduce is disabled" in result.message, \
        result.message


def test_calling_torch_distributed_is_not_the_exercise_either():
    result = C.ring_all_gather(all_gather_calls_torch)
    assert not result
    assert "called the collective(s) all_gather" in result.message, result.message


def test_hints_come_on_request_from_what_differs_to_the_idea(capsys):
    from labkit.check import hints
    hints.reset()
    first, second, third, fourth = (C.hint("ring-all-reduce") for _ in range(4))
    assert first.startswith("[hint 1 of 3] ring-all-reduce: draw the table") and "ADD" not in first, first
    assert "[hint 2 of 3]" in second and "ADDS" in second and "chunk r-k-1" in third and fourth == third
    assert C.hint("ring-all-gather").startswith("[hint 1 of 3]"), "each exercise starts at hint 1"
    assert capsys.readouterr().out.count("[hint") == 5
    hints.reset()


def test_all_gather_wrong_order_is_named():
    result = C.ring_all_gather(all_gather_wrong_order)
    assert not result
    assert "wrong place" in result.message and "position 1 holds rank 3's chunk" in result.message, \
        result.message


def test_all_gather_through_one_rank_fails_on_bytes():
    result = C.ring_all_gather(all_gather_send_everything)
    assert not result
    # rank 0 sends the 192-byte result to 3 peers (576); a ring sends 3/4 x 192 = 144 per rank
    assert "rank 0 sent 576 bytes" in result.message and "144" in result.message, result.message


def test_crash_becomes_a_failed_check():
    result = C.ring_all_reduce(crashes)
    assert not result
    assert "rank 2 raised ZeroDivisionError: student bug on rank 2" in result.message, result.message


def test_hang_becomes_a_failed_check():
    result = C.ring_all_gather(hangs, timeout=5.0)
    assert not result
    assert "a hang" in result.message and "[0, 1, 2, 3]" in result.message, result.message
    assert "recv" in result.hint


def test_returning_none_fails():
    result = C.ring_all_reduce(returns_nothing)
    assert not result and "returned NoneType" in result.message, result.message


def test_sizes_the_ring_cannot_split_are_rejected():
    with pytest.raises(ValueError, match="numel 10 must be divisible by world_size 4"):
        C.ring_all_reduce(ring_all_reduce_ok, numel=10)

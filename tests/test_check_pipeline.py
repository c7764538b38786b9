"""The pipeline labs' checks (labkit/check/pipeline.py, pipeline_loop.py): 1F1B, interleaved, the two
predictions, and the 1F1B loop over send/recv.

Schedules and loops are written here independently of the labs' solutions. Tier 1 for the schedule
failures (found before any process starts); one gloo run each for the passing 1F1B and interleaved
lists (against the dense model's gradients); three 2-rank runs of the loop check (a correct loop, a
GPipe loop that holds every microbatch, a naive loop whose facing sends deadlock, stopped after 8 s).
About 35 s on the 2-core machine.
"""
from labkit import comm
from labkit.check import pipeline as P
from labkit.check import pipeline_loop as PL
from labkit.pipeline_parallel import schedules as S
from labkit.pipeline_parallel.schedules import Action


def one_f_one_b(p, m, rank):
    w = min(p - rank - 1, m)
    out = [Action("F", i) for i in range(w)]
    for i in range(m - w):
        out += [Action("F", w + i), Action("B", i)]
    return out + [Action("B", i) for i in range(m - w, m)]


def gpipe(p, m, rank):
    return [Action("F", i) for i in range(m)] + [Action("B", i) for i in range(m)]


def calls_labkit(p, m, rank):
    return S.one_f_one_b(p, m)[rank]


def interleaved(p, v, m, rank, reverse=True, extra_warmup=0):
    order = [(mb, c) for g in range(0, m, p) for c in range(v) for mb in range(g, g + p)]
    fwd = [Action("F", mb, c) for mb, c in order]
    bwd = [Action("B", mb, (v - 1 - c) if reverse else c) for mb, c in order]
    w = min(2 * (p - rank - 1) + (v - 1) * p + extra_warmup, m * v)
    out = fwd[:w]
    for i in range(m * v - w):
        out += [fwd[w + i], bwd[i]]
    return out + bwd[m * v - w:]


def test_one_f_one_b_passes_and_gpipe_fails_on_memory():
    ok = P.one_f_one_b(one_f_one_b)
    assert ok and "gradients equal the dense model's" in ok.message, ok.line()
    too_much = P.one_f_one_b(gpipe)
    assert not too_much and "rank 0 holds 4 microbatches at once" in too_much.message, too_much.line()
    assert too_much.hint.startswith("too many activations held at once")
    refused = P.one_f_one_b(calls_labkit)
    assert not refused and "schedules.one_f_one_b is disabled" in refused.message, refused.line()


def test_interleaved_passes_and_names_wrong_orders():
    ok = P.interleaved(interleaved)
    assert ok and "NCCL-safe p2p" in ok.message, ok.line()
    late = P.interleaved(lambda p, v, m, r: interleaved(p, v, m, r, extra_warmup=1))
    assert not late and "Megatron's warm-up holds" in late.message, late.line()
    unreversed = P.interleaved(lambda p, v, m, r: interleaved(p, v, m, r, reverse=False))
    assert not unreversed and "deadlock" in unreversed.message and "(p=2, v=2, m=4)" in unreversed.name, unreversed.line()


def test_predictions():
    assert P.bubble(3 / 16, S.interleaved(4, 2, 8))
    wrong = P.bubble(3 / 8, S.interleaved(4, 2, 8))
    assert not wrong and "predicted 0.3750, the simulator says 0.1875" in wrong.message
    assert P.p2p_messages(12, S.interleaved(2, 2, 4)) and P.p2p_messages(4, S.one_f_one_b(2, 4))
    wrong = P.p2p_messages(8, S.interleaved(2, 2, 4))          # v messages per microbatch: wrong
    assert not wrong and "rank 0 sends 12 messages" in wrong.message
    assert not P.p2p_messages(None, S.interleaved(2, 2, 4))


# ------------------------------------------------------------------ the 1F1B loop over send/recv
def loop_1f1b(stage, group, m):
    """Megatron's three phases; each steady-state send paired with its receive (no deadlock)."""
    r, p, first, last = stage.rank, stage.size, stage.is_first, stage.is_last
    w = min(p - r - 1, m)
    for mb in range(w):
        comm.send(group, stage.forward(mb, None if first else comm.recv(group, r - 1)), r + 1)
    x = None if first or w == m else comm.recv(group, r - 1)
    for i in range(m - w):
        y = stage.forward(w + i, x)
        dx = stage.backward(i, None if last else comm.send_recv(group, y, r + 1, r + 1))
        if first:
            x = None
        elif i == m - w - 1:
            comm.send(group, dx, r - 1)
        else:
            x = comm.send_recv(group, dx, r - 1, r - 1)
    for mb in range(m - w, m):
        dx = stage.backward(mb, None if last else comm.recv(group, r + 1))
        if not first:
            comm.send(group, dx, r - 1)


def loop_by_actions(order):
    """A loop that runs an action order with one blocking send or receive at a time."""
    def loop(stage, group, m):
        r = stage.rank
        for kind, mb in order(stage.size, m, r):
            if kind == "F":
                y = stage.forward(mb, None if stage.is_first else comm.recv(group, r - 1))
                if not stage.is_last:
                    comm.send(group, y, r + 1)
            else:
                dx = stage.backward(mb, None if stage.is_last else comm.recv(group, r + 1))
                if not stage.is_first:
                    comm.send(group, dx, r - 1)
    return loop


def test_the_loop_check_passes_megatrons_loop_and_names_gpipe_and_the_deadlock():
    ok = PL.one_f_one_b_loop(loop_1f1b, world_size=2, m=4)
    assert ok and "equals the dense model's" in ok.message, ok.line()
    gp = PL.one_f_one_b_loop(loop_by_actions(lambda p, m, r: [(a.kind, a.microbatch) for a in gpipe(p, m, r)]),
                             world_size=2, m=4)
    assert not gp and "rank 0 held 4 microbatches at once" in gp.message and "GPipe" in gp.message, gp.line()
    naive = PL.one_f_one_b_loop(loop_by_actions(lambda p, m, r: [(a.kind, a.microbatch) for a in one_f_one_b(p, m, r)]),
                                world_size=2, m=4, timeout=8.0)
    assert not naive and "wait for each other" in naive.message and "comm.send_recv" in naive.hint, naive.line()

"""The pipeline labs' checks (labkit/check/pipeline.py): 1F1B, interleaved, and the two predictions.

Schedules are written here independently of the labs' solutions. Tier 1 for the failures (they are
found before any process starts); one gloo run each for the passing 1F1B and interleaved lists
(against the dense model's gradients). About 15 s on the 2-core machine.
"""
from labkit.check import pipeline as P
from labkit.check import reset_hints
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
    reset_hints()
    too_much = P.one_f_one_b(gpipe)
    assert not too_much and "rank 0 holds 4 microbatches at once" in too_much.message, too_much.line()
    assert too_much.hint.startswith("(1 of 2)")
    refused = P.one_f_one_b(calls_labkit)
    assert not refused and "schedules.one_f_one_b is disabled" in refused.message, refused.line()
    reset_hints()


def test_interleaved_passes_and_names_wrong_orders():
    ok = P.interleaved(interleaved)
    assert ok and "NCCL-safe p2p" in ok.message, ok.line()
    reset_hints()
    late = P.interleaved(lambda p, v, m, r: interleaved(p, v, m, r, extra_warmup=1))
    assert not late and "Megatron's warm-up holds" in late.message, late.line()
    unreversed = P.interleaved(lambda p, v, m, r: interleaved(p, v, m, r, reverse=False))
    assert not unreversed and "deadlock" in unreversed.message and "(p=2, v=2, m=4)" in unreversed.name, unreversed.line()
    reset_hints()


def test_predictions():
    assert P.bubble(3 / 16, S.interleaved(4, 2, 8))
    wrong = P.bubble(3 / 8, S.interleaved(4, 2, 8))
    assert not wrong and "predicted 0.3750, the simulator says 0.1875" in wrong.message
    assert P.p2p_messages(12, S.interleaved(2, 2, 4)) and P.p2p_messages(4, S.one_f_one_b(2, 4))
    wrong = P.p2p_messages(8, S.interleaved(2, 2, 4))          # v messages per microbatch: wrong
    assert not wrong and "rank 0 sends 12 messages" in wrong.message
    assert not P.p2p_messages(None, S.interleaved(2, 2, 4))

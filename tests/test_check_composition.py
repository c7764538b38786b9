"""The PTD-P lab's checks that run no rank: the rank grid's groups and the capstone's hand predictions.

Correct answers are written here independently of the lab's solutions; each plausible mistake must
fail with a message that says what differs. The step-bytes check runs ``labkit.train`` on 8 ranks:
its passing path is the lab's master (nbval), its failing path the isolated grading of
test_check_isolation.py. About 5 s on the 2-core machine (the planner's search runs once).
"""
from labkit.check import capstone as CAP
from labkit.check import composition as C

ORDER = ("tp", "cp", "dp", "pp")


def groups(world, sizes, axis, order=ORDER):
    spans = {"dp_cp": ("cp", "dp"), "mp": ("tp", "pp")}.get(axis, (axis,))
    found = {}
    for rank in range(world):
        c, rest = {}, rank
        for ax in order:
            c[ax], rest = rest % sizes[ax], rest // sizes[ax]
        found.setdefault(tuple(c[ax] for ax in order if ax not in spans), []).append(rank)
    return list(found.values())


def test_rank_grid_passes_megatrons_groups_and_names_a_wrong_order():
    assert C.rank_grid(groups)
    wrong = C.rank_grid(lambda w, s, a: groups(w, s, a, order=("tp", "dp", "cp", "pp")))   # dp before cp
    assert not wrong and "axis cp" in wrong.message and "tp varies fastest, then cp" in wrong.hint, wrong.line()
    reversed_ = C.rank_grid(lambda w, s, a: [g[::-1] for g in groups(w, s, a)])
    assert not reversed_ and "not in ascending order" in reversed_.message, reversed_.line()


def predict(model, layout, held=None, fp32_grads=True):
    L, h, s = model.num_layers, model.hidden_size, model.seq_length
    t, p, d = layout["tp"], layout["pp"], layout["dp"]
    b, m = layout["micro_batch_size"], layout["num_microbatches"]
    V = -(-model.vocab_size // (128 * t)) * 128 * t
    params = (L // p) * (12 * h * h + 13 * h) / t + V * h / t + s * h
    held = min(p, m) if held is None else held
    memory = params * (2 + (4 if fp32_grads else 2) + 12 / d) + 34 * s * b * h / t * (L // p) * held
    tokens = layout["global_batch_size"] * s
    flops = 6 * tokens * (L * (12 * h * h + 13 * h) + V * h) + 8 * tokens * L * s * h
    step = flops / (layout["num_gpus"] * layout["gpu_peak_tflops"] * 1e12 * layout["assumed_mfu"]) * (1 + (p - 1) / m)
    return {"params_per_gpu": params, "memory_gib": memory / 2**30, "flops_per_step": flops, "step_time_s": step}


def test_capstone_passes_hand_formulas_and_names_the_number_that_is_off():
    ok = CAP.capstone(predict)
    want = CAP.truth("megatron-39b", 8, 1024, CAP.WINNER)          # the planner's own numbers
    assert ok and f"labkit.calc: 60.2 GiB, {want['step_time_s']:.1f} s (planner)" in ok.message, ok.line()
    assert CAP.capstone(predict, layout={"tp": 4, "pp": 4, "dp": 4, "micro_batch_size": 4})   # a hidden layout
    gpipe = CAP.capstone(lambda m, lay: predict(m, lay, held=lay["num_microbatches"]))    # GPipe's memory
    assert not gpipe and gpipe.message.startswith("memory of a first-stage GPU") and "% off" in gpipe.message
    bf16 = CAP.capstone(lambda m, lay: predict(m, lay, fp32_grads=False))                 # 16 bytes, not 18
    assert not bf16 and "memory" in bf16.message, bf16.line()
    missing = CAP.capstone(lambda m, lay: {"params_per_gpu": 1})
    assert not missing and "no number under 'memory_gib'" in missing.message, missing.line()

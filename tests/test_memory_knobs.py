"""Memory knobs at runtime: bf16/fp16 with fp32 main gradients, loss scaling, activation
recomputation, per-layer ZeRO-3 and ZeRO-2 during the backward. Issue "Memory knobs at runtime".

Precision bounds, written down before the runs (u = unit roundoff: 2^-8 bf16, 2^-11 fp16,
2^-24 fp32; N = microbatches of the global batch; k = iteration, from 1):

* Same precision, gradients after step 1. labkit and the one-device reference compute every
  microbatch's 16-bit gradient x_i from the same weights with the same kernels on one thread, so
  the x_i agree bitwise (bf16: exact powers of two separate the two runs' loss scalings, which
  bf16's range leaves exact; fp16 is compared on one rank for that reason, its subnormals round a
  scaled value differently). They differ only in the order the main_grad sums them, so Higham's
  bound for a sum of N terms in any order applies to each, and to their difference twice:
  |g_labkit - g_ref| <= 2 (N-1) u_acc sum_i |x_i|, u_acc the main_grad's unit roundoff.
  Negative control: main_grad in the 16-bit dtype (u_acc = u16 in place of u32) breaks it.
* Same precision, losses: the fp32 masters then differ by rounding, and a 16-bit weight by at most
  one ulp where its master sits at a rounding boundary: |L_k - L_ref,k| <= k u16 L_ref,k.
* Against the fp32 model: the weights are rounded once to 16 bits (u), the forward's roundings
  move the loss by at most u L at first order, and each iteration's gradient differences by at
  most u L more: |L_k - L_fp32,k| <= (2 + k) u16 L_fp32,k.
"""
from __future__ import annotations

import pytest
import torch

import labkit
from labkit.calc.memory import zero_memory_per_rank
from labkit.measure.memory_knobs import fsdp_timeline, layer_saved_bytes, runs
from labkit.reference import train_reference

U = {"bf16": 2.0 ** -8, "fp16": 2.0 ** -11, "fp32": 2.0 ** -24}
MODEL = dict(num_layers=2, hidden_size=32, num_attention_heads=4, seq_length=16, micro_batch_size=2,
             global_batch_size=8)
N = 4          # microbatches of 2 in the global batch of 8


def _grad_excess(got: dict, ref: dict, u_acc: float) -> float:
    """Largest |g - g_ref| - 2 (N-1) u_acc sum_i |x_i| over every element (> 0: bound broken)."""
    return max(float(((got[n] - g).abs() - 2 * (N - 1) * u_acc * ref["grad_abs_sums"][n]).max())
               for n, g in ref["grads"].items())


def _loss_ok(losses, ref_losses, per_step) -> bool:
    return all(abs(a - b) <= per_step(k) * abs(b) for k, (a, b) in enumerate(zip(losses, ref_losses), 1))


@pytest.fixture(scope="module")
def dp2():
    configs = {"bf16": dict(MODEL, bf16=True), "bf16 distributed": dict(MODEL, bf16=True, use_distributed_optimizer=True),
               "fp32": dict(MODEL), "fp32 distributed": dict(MODEL, use_distributed_optimizer=True),
               "fp16": dict(MODEL, fp16=True, loss_scale=2.0 ** 10),
               "fp16 distributed": dict(MODEL, fp16=True, loss_scale=2.0 ** 10, use_distributed_optimizer=True)}
    return runs(2, configs, steps=5)


def test_bf16_grads_equal_one_device_within_the_fp32_accumulation_bound(dp2):
    ref = train_reference(world_size=2, steps=5, capture_grads=True, bf16=True, **MODEL)
    fp32 = train_reference(world_size=2, steps=5, **MODEL)
    for name in ("bf16", "bf16 distributed"):
        assert _grad_excess(dp2[name]["grads"], ref, U["fp32"]) <= 0, name
        assert _loss_ok(dp2[name]["losses"], ref["losses"], lambda k: k * U["bf16"]), name
        assert _loss_ok(dp2[name]["losses"], fp32, lambda k: (2 + k) * U["bf16"]), name


def test_negative_control_bf16_accumulation_breaks_the_bound():
    broken = runs(2, {"bf16": dict(MODEL, bf16=True)}, steps=1, trap="16-bit accumulation")["bf16"]
    ref = train_reference(world_size=2, steps=1, capture_grads=True, bf16=True, **MODEL)
    assert _grad_excess(broken["grads"], ref, U["fp32"]) > 0


@pytest.mark.parametrize("fp32_grads", [False, True])
def test_fp16_equals_one_device_and_stays_near_fp32(fp32_grads, dp2):
    kw = dict(MODEL, fp16=True, loss_scale=2.0 ** 10, accumulate_allreduce_grads_in_fp32=fp32_grads)
    res = labkit.train(world_size=1, steps=5, log_interval=0, capture_grads=True, **kw)
    ref = train_reference(world_size=1, steps=5, capture_grads=True, **kw)
    assert _grad_excess(res.grads, ref, U["fp32" if fp32_grads else "fp16"]) <= 0
    assert _loss_ok(res.losses, ref["losses"], lambda k: k * U["fp16"])
    fp32 = train_reference(world_size=1, steps=5, **MODEL)
    assert _loss_ok(res.losses, fp32, lambda k: (2 + k) * U["fp16"])
    ref2 = train_reference(world_size=2, steps=5, **dict(MODEL, fp16=True, loss_scale=2.0 ** 10))
    for name in ("fp16", "fp16 distributed"):     # DP 2: the losses, within the same-precision bound
        assert _loss_ok(dp2[name]["losses"], ref2, lambda k: k * U["fp16"]), name


def test_memory_per_rank_equals_calc_for_every_precision(dp2):
    """fp32 4 + 4 + 8 = 16 B, bf16 2 + 4 + 12 = 18 B, fp16 2 + 2 + 12 = 16 B per parameter; the
    distributed optimizer divides the optimizer's part by d = 2 (labkit.calc.memory)."""
    per_param = {"fp32": (4, 4, 8), "bf16": (2, 4, 12), "fp16": (2, 2, 12)}
    for name, run in dp2.items():
        bp, bg, bo = per_param[name.split()[0]]
        want = zero_memory_per_rank(run["num_params"], 2, int("distributed" in name), bp, bg, bo)
        for r, held in enumerate(run["memory"]):
            assert held == want, (name, r, held, want)


def test_loss_scale_skips_an_overflowing_iteration_as_megatron(monkeypatch):
    """fp16 with an initial loss scale of 2^40: the scaled gradients overflow. Megatron's dynamic
    scaler with hysteresis 2 keeps the scale at the first overflow and halves it at the second;
    each overflowing iteration is skipped (the weights do not move) and logged as skipped."""
    res = labkit.train(world_size=1, steps=3, log_interval=0, fp16=True, initial_loss_scale=2.0 ** 40,
                       hysteresis=2, **MODEL)
    assert res.skipped[:2] == [True, True]
    assert res.loss_scales[:2] == [2.0 ** 40, 2.0 ** 39]
    from labkit.training import format_iteration
    line = format_iteration(1, 3, 8, 1.0, 1e-3, 8, res.losses[0], res.grad_norms[0], None, res.loss_scales[0], 1)
    assert "loss scale: 1099511627776.0 |" in line and "number of skipped iterations:   1 |" in line
    assert "grad norm" not in line
    from labkit.precision import DynamicGradScaler
    s = DynamicGradScaler(8.0, 1.0, growth_interval=2, hysteresis=1)
    for found, want in ((True, 4.0), (False, 4.0), (False, 8.0), (True, 4.0)):
        s.update(found)
        assert s.scale == want


def test_hysteresis_counts_overflows_since_the_last_growth_not_in_a_row():
    """Megatron's DynamicGradScaler.update (megatron/core/optimizer/grad_scaler.py, d98e8a64)
    decrements the hysteresis tracker on every overflow and restores it only when the scale grows:
    two overflows with clean iterations between them halve the scale (a scaler counting overflows
    "in a row" would not), every later overflow halves it again, and a growth resets the count."""
    from labkit.precision import DynamicGradScaler
    s = DynamicGradScaler(1024.0, 1.0, growth_interval=4, hysteresis=2)
    pattern = [True, False, False, True,      # 2 overflows, not consecutive: halve at the second
               False, True,                   # each later overflow halves again
               False, False, False, False,    # 4 clean: grow, hysteresis restored to 2
               True, False, True]             # so it takes two overflows again
    scales = []
    for found in pattern:
        s.update(found)
        scales.append(s.scale)
    assert scales == [1024, 1024, 1024, 512, 512, 256, 256, 256, 256, 512, 512, 512, 256]


def test_skipped_iteration_leaves_the_weights():
    def worker():
        from labkit import data
        from labkit.config import TrainConfig
        from labkit.training import build_rank, rank_microbatches
        cfg = TrainConfig(**MODEL, fp16=True, initial_loss_scale=2.0 ** 40)
        topo, _, engine = build_rank(cfg)
        before = [p.detach().clone() for p in engine.runner.chunks[0].parameters()]
        engine.step(rank_microbatches(cfg, topo, 0, 0, data.load_tokens()))
        after = list(engine.runner.chunks[0].parameters())
        return engine.skipped_iterations, all(torch.equal(a, b) for a, b in zip(before, after))
    assert labkit.launch(worker, 1)[0] == (1, True)


# -- activation recomputation ----------------------------------------------------------------------
RECOMPUTE = {"none": {}, "selective": dict(recompute_granularity="selective"),
             "full uniform": dict(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1),
             "full block": dict(recompute_granularity="full", recompute_method="block", recompute_num_layers=1)}
DROPOUT = dict(num_layers=2, hidden_size=32, num_attention_heads=4, seq_length=16, micro_batch_size=2,
               global_batch_size=4, params_dtype="float64", hidden_dropout=0.1)


@pytest.mark.parametrize("world, layout", [
    (2, dict(tensor_model_parallel_size=2, sequence_parallel=True, attention_dropout=0.1)),
    (2, dict(pipeline_model_parallel_size=2, attention_dropout=0.1)),
    (2, dict(context_parallel_size=2)),                 # CP: attention dropout is refused
], ids=["tp2 sp", "pp2", "cp2"])
def test_recompute_gives_identical_grads_with_dropout(world, layout):
    configs = {name: dict(DROPOUT, **layout, **rc) for name, rc in RECOMPUTE.items()}
    got = runs(world, configs, steps=2)
    base = got["none"]
    for name, res in got.items():
        assert res["losses"] == base["losses"], name
        for p, g in base["grads"].items():
            torch.testing.assert_close(res["grads"][p], g, rtol=1e-12, atol=1e-12, msg=f"{name} {p}")
    if "tensor_model_parallel_size" in layout:       # negative control: recompute without the RNGs
        broken = runs(world, {"full": configs["full uniform"]}, steps=1, trap="no RNG restore")["full"]
        assert max(float((broken["grads"][p] - g).abs().max()) for p, g in base["grads"].items()) > 1e-6


def test_saved_bytes_per_layer_none_selective_full():
    """Full recomputation keeps the layer's input (Korthikanti's 2sbh in 16-bit: sbh x 4 B here);
    selective drops the attention scores' softmax (b a s^2 x 4 B) and labkit's causal mask (s^2 B),
    the 5as/h term of Korthikanti's Table 2 that calc.memory drops."""
    from labkit.measure.activations import labkit_layer_activation_bytes
    s, b, h, a = 64, 2, 64, 4
    got = layer_saved_bytes(s, b, h, a)
    items = labkit_layer_activation_bytes(s, b, h, a)
    assert got["none"] == sum(items.values())
    assert got["none"] - got["selective"] == items["softmax output"] + items["causal mask (bool)"]
    assert got["full"] == s * b * h * 4
    from labkit.calc.memory import activation_bytes_per_layer
    assert got["full"] == 2 * activation_bytes_per_layer(s, b, h, a, recompute="full")   # calc's 2sbh in 16-bit


def test_recompute_rules_are_megatrons():
    from labkit.config import TrainConfig
    for kw, msg in ((dict(recompute_granularity="full"), 'recompute_method must be "block" or "uniform"'),
                    (dict(recompute_granularity="full", recompute_method="uniform"), "recompute_num_layers must be between"),
                    (dict(recompute_granularity="selective", recompute_method="uniform"), "not yet supported for selective"),
                    (dict(recompute_granularity="selective", recompute_num_layers=1), "recompute_num_layers must be None"),
                    (dict(recompute_granularity="selective", recompute_modules=("moe_act",)), "labkit recomputes"),
                    (dict(bf16=True, fp16=True), "exclusive"), (dict(bf16=True, zero_stage=3), "zero_stage 0 or 1")):
        with pytest.raises(ValueError, match=msg):
            TrainConfig(**MODEL, **kw).validate(2)


# -- per-layer ZeRO-3, ZeRO-2 during the backward ---------------------------------------------------
def test_per_layer_zero3_prefetches_and_holds_one_shard_plus_two_units():
    t = fsdp_timeline(world_size=2)
    ev = t["events"]
    for i in range(len(t["units"]) - 1):              # gather of unit i+1 issued before unit i computes
        assert ev.index(("gather", i + 1)) < ev.index(("compute", i)), ev
    shard = sum(s for _, _, s in t["units"])
    two = sum(sorted(full for _, full, _ in t["units"])[-2:])
    assert max(b for _, _, b in t["per-layer"]) <= shard + two
    assert max(b for _, _, b in t["whole-model"]) == shard + sum(full for _, full, _ in t["units"])


def test_zero2_never_holds_a_full_gradient_and_a_plain_run_records_nothing():
    """Per-layer ZeRO-2/3 record events and memory samples only inside ``dp.recording()``: a plain
    step leaves every list the DP object holds as long as it was (nothing accumulates)."""
    def worker():
        from labkit import data
        from labkit.config import TrainConfig
        from labkit.training import build_rank, rank_microbatches
        tokens, out = data.load_tokens(), {}
        for stage in (2, 3):
            cfg = TrainConfig(num_layers=4, hidden_size=32, num_attention_heads=4, seq_length=16,
                              micro_batch_size=2, global_batch_size=8, zero_stage=stage)
            topo, _, engine = build_rank(cfg)
            dp = engine.dp.members[-1]
            lengths = lambda: {k: len(v) for k, v in vars(dp).items() if isinstance(v, list)}  # noqa: E731
            before = lengths()
            engine.step(rank_microbatches(cfg, topo, 0, 0, tokens))           # a plain step: 2 microbatches
            plain = (before, lengths(), dp.probe)
            with dp.recording() as rec:
                engine.step(rank_microbatches(cfg, topo, 1, 0, tokens))
            full = sum(p.numel() * p.element_size() for p in dp.params)
            out[stage] = plain, dp.probe, max(rec.grad_samples), full, len(dp.units), \
                [e for e in rec.events if e[0] == "reduce_scatter"], len(rec.samples)
        return out
    for stage, ((before, after, probe), probe_after, peak, full, units, scatters, samples) in \
            labkit.launch(worker, 2)[0].items():
        assert before == after and probe is None and probe_after is None, (stage, before, after)
        # one reduce-scatter per unit (a layer, the embedding, the head) per microbatch, during the backward
        assert len(scatters) == 2 * units == 12 and peak < full / 2, (stage, peak, full, scatters)
        assert samples >= len(scatters), (stage, samples)


def test_memory_figures_are_legible_on_a_phone():
    from labkit.figures import MIN_LABEL_PX, smallest_label_px, svg
    from labkit.figures import memory_knobs as F
    rows = [dict(config=c, params=p, grads=g, optimizer=o, calc=p + g + o)
            for c, p, g, o in [("fp32", 4, 4, 8), ("fp32 + dist. opt.", 4, 4, 4), ("bf16", 2, 4, 12)]]
    units = [("embedding", 8, 4), ("layer 0", 20, 10), ("head", 4, 2)]
    timeline = {"units": units, "per-layer": [("gather", 0, 16), ("free", 0, 26)],
                "whole-model": [("compute", 0, 48), ("free", 0, 48)]}
    for fig in (F.memory_per_precision(rows), F.live_params(timeline),
                F.recompute_tradeoff({"none": 3, "selective": 2, "full": 1}, {"none": 1, "selective": 1.1, "full": 1.3})):
        assert smallest_label_px(svg(fig)) >= MIN_LABEL_PX


def test_recompute_flops_ratio_equals_counted_flops():
    """Defect 5 of issue 36: the chapter's recompute cost is the analytic FLOPs ratio, not a noisy CPU
    time. Checked against torch's own FLOP counter on a labkit TransformerLayer: the forward of the
    layer and of its attention core (what selective recomputation runs again), backward = 2x forward."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from labkit.measure.memory_knobs import recompute_flops_ratio
    from labkit.model import GPTConfig, TransformerLayer
    s, b, h = 16, 2, 32
    layer = TransformerLayer(GPTConfig(num_layers=1, hidden_size=h, num_attention_heads=4, seq_length=s)).double()
    x = torch.randn(b, s, h, dtype=torch.float64)
    with FlopCounterMode(display=False) as whole:
        layer(x)
    counts = whole.get_flop_counts()
    cores = [name for name in counts if name.endswith("core_attention")]
    assert len(cores) == 1, list(counts)
    core = sum(counts[cores[0]].values())
    forward, attn = whole.get_total_flops(), core
    assert attn > 0 and forward > attn
    got = recompute_flops_ratio(s, b, h)
    assert got["selective"] == pytest.approx((3 * forward + attn) / (3 * forward), rel=1e-12)
    assert got["full"] == pytest.approx(4 / 3) and got["none"] == 1.0


@pytest.mark.parametrize("trap", ["16-bit accumulation", "no RNG restore"])
def test_a_trap_is_taken_out_after_its_run_even_when_the_run_fails(trap):
    """Under torchrun a run is the calling process itself: a trap left patched in would silently
    break every later run of that process (it did before ``planted``)."""
    from labkit import recompute
    from labkit.config import TrainConfig
    from labkit.data_parallel import mixed
    from labkit.measure.memory_knobs import planted
    cfg = TrainConfig(**dict(MODEL, bf16=True))
    before = mixed.main_grad_dtype, recompute.apply
    assert mixed.main_grad_dtype(cfg) == torch.float32
    with pytest.raises(RuntimeError, match="inside the run"):
        with planted(trap):
            assert (mixed.main_grad_dtype(cfg) == torch.bfloat16) == (trap == "16-bit accumulation")
            assert (recompute.apply is before[1]) == (trap != "no RNG restore")
            raise RuntimeError("inside the run")
    assert (mixed.main_grad_dtype, recompute.apply) == before and mixed.main_grad_dtype(cfg) == torch.float32
    with pytest.raises(ValueError, match="trap must be one of"):
        with planted("no such trap"):
            pass

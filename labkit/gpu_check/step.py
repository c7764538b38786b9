"""Single-GPU training step of GPT-2 small/medium/large: time, MFU, peak memory against labkit.calc.

The run (one rank on GPU 0, launched with NCCL, so ``launcher.device()`` places it):

* model ``labkit.model.GPT(cfg, seed=0)``, fp32 weights, sequence 1024, vocab 50304, random
  tokens (speed and memory do not depend on their values);
* one step = forward and loss under ``torch.autocast("cuda", dtype=torch.bfloat16)``, backward,
  ``torch.optim.AdamW`` (PyTorch's default CUDA implementation), ``zero_grad(set_to_none=True)``;
* ``warmup`` steps, then ``iters`` steps timed with ``launcher.timer`` (synchronized wall clock);
  peak memory is ``torch.cuda.max_memory_allocated`` over the timed steps;
* micro batch size 4 by default; on out-of-memory it is halved, and the row says which was used.

FLOPs are ``labkit.calc.model_flops_per_iteration``: Megatron-LM's ``num_floating_point_operations``
(megatron/training/training.py at d98e8a64), which counts the attention scores of a CAUSAL mask
(half of the s x s products: 6*b*s*L*h*s per step instead of 12*b*s*L*h*s) and no recomputation.
MFU = those FLOPs / (step time x the GPU's dense bf16 peak) (Chowdhery et al. 2022, PaLM, App. B).
labkit's attention is the plain "math" one (the s x s probabilities are stored), not FlashAttention,
so its MFU is a floor for this model code, not for the GPU; each model therefore also runs with
torch's fused ``scaled_dot_product_attention`` swapped in (``--attention``, rows "sdpa").

Memory prediction: ``labkit.calc.memory_per_stage`` for the same model and batch, with 4-byte
weights and gradients, 8 bytes of AdamW state per parameter, 2-byte activations, no dropout, and
math attention. Not modelled: autocast's bf16 copies of the weights, the fp32 tensors autocast
keeps (residual stream, LayerNorm and softmax outputs, the logits for the loss), the allocator's
fragmentation. An extra untimed step reads memory in two parts so the report shows where the
difference is: between steps (weights + AdamW state, against calc's params + optimizer) and what the
forward adds (tensors saved for backward, against calc's activations).
"""
from __future__ import annotations

from .. import calc
from ..model import GPTConfig, preset

# GPT-2 (Radford et al. 2019, Table 2): 12/24/36 layers of width 768/1024/1280; heads 12/16/20 as
# in the released hyper-parameters; context 1024; vocabulary 50257 padded to 50304 (multiple of 128)
MODELS = {"gpt2": preset("gpt2"),
          "gpt2-medium": preset("gpt2-medium"),
          "gpt2-large": preset("gpt2-large")}
# "math": labkit.model's attention (what the labs run); "sdpa": the same model with torch's fused
# scaled_dot_product_attention (FlashAttention kernels on Hopper), calc's attention="flash"
ATTENTION = {"math": "math", "sdpa": "flash"}
PRECISION = calc.PrecisionConfig(4, 4, 8, 2, "fp32 weights and AdamW, bf16 autocast activations")


def calc_model(cfg: GPTConfig) -> calc.ModelConfig:
    """The labkit.calc description of a labkit.model GPT (learned positions, LayerNorm, biases)."""
    return calc.ModelConfig(cfg.num_layers, cfg.hidden_size, cfg.num_attention_heads,
                            seq_length=cfg.seq_length, vocab_size=cfg.vocab_size,
                            ffn_hidden_size=cfg.ffn_hidden_size,
                            untie_embeddings_and_output_weights=cfg.untie_embeddings_and_output_weights)


def summarize(name: str, cfg: GPTConfig, micro_batch_size: int, step_seconds: float,
              peak_memory_bytes: int | None, peak_flops: float | None,
              static_bytes: int | None = None, saved_bytes: int | None = None,
              attention: str = "math") -> dict:
    """One report row from a measured step: throughput, MFU and memory next to labkit.calc.

    ``static_bytes`` (between steps: weights, optimizer state) and ``saved_bytes`` (what the
    forward adds) are compared with calc's params + optimizer and activations, when measured.
    """
    model, par = calc_model(cfg), calc.ParallelConfig(world_size=1, micro_batch_size=micro_batch_size)
    flops = calc.model_flops_per_iteration(model, par)
    predicted = calc.memory_per_stage(model, par, PRECISION, dropout=False,
                                      attention=ATTENTION[attention])[0]
    return {"model": name, "attention": attention, "num_parameters": predicted["num_params"],
            "micro_batch_size": micro_batch_size, "seq_length": cfg.seq_length,
            "step_seconds": step_seconds,
            "tokens_per_second": micro_batch_size * cfg.seq_length / step_seconds,
            "model_flops": flops, "achieved_flops": flops / step_seconds, "peak_flops": peak_flops,
            "mfu": calc.utilization(flops, step_seconds, 1, peak_flops) if peak_flops else None,
            "peak_memory_bytes": peak_memory_bytes, "predicted_memory_bytes": predicted["total"],
            "memory_error": None if peak_memory_bytes is None else peak_memory_bytes / predicted["total"] - 1,
            "static_bytes": static_bytes, "predicted_static_bytes": predicted["params"] + predicted["optimizer"],
            "saved_bytes": saved_bytes, "predicted_activation_bytes": predicted["activations"]}


def _sdpa(q, k, v):           # [b, n, s, d] each; presets have attention_dropout 0
    import torch.nn.functional as F
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def _timed_steps(cfg, micro_batch_size, warmup, iters, attention="math"):
    import torch

    from ..launcher import device, timer
    from ..model import GPT, CoreAttention
    dev = device()
    model = GPT(cfg, seed=0).to(dev)
    if attention == "sdpa":
        if cfg.attention_dropout:
            raise ValueError("attention='sdpa' here has no dropout; this model has attention_dropout > 0")
        for m in model.modules():
            if isinstance(m, CoreAttention):
                m.forward = _sdpa
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    gen = torch.Generator(device=dev).manual_seed(0)
    data = torch.randint(0, cfg.vocab_size, (micro_batch_size, cfg.seq_length + 1), device=dev,
                         generator=gen)
    tokens, labels = data[:, :-1], data[:, 1:]              # [b, s] each

    def step():
        with torch.autocast(dev.type, dtype=torch.bfloat16):
            loss = model.loss(tokens, labels)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    cuda = dev.type == "cuda"  # (a CPU rank runs the same code in the tests, without memory stats)
    for _ in range(warmup):
        step()
    if cuda:
        torch.cuda.reset_peak_memory_stats(dev)
    with timer() as t:
        for _ in range(iters):
            loss = step()
    if not cuda:
        return t.seconds / iters, None, float(loss), None
    peak = torch.cuda.max_memory_allocated(dev)
    # One more, untimed step, read in parts: what lives between steps (weights, AdamW state, the
    # batch; grads are None) and what the forward adds (tensors saved for backward, autocast's bf16
    # weight copies among them, and the loss) -- the two halves of calc's prediction.
    torch.cuda.synchronize(dev)
    static = torch.cuda.memory_allocated(dev)
    with torch.autocast(dev.type, dtype=torch.bfloat16):
        last = model.loss(tokens, labels)
    torch.cuda.synchronize(dev)
    saved = torch.cuda.memory_allocated(dev) - static
    last.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return t.seconds / iters, peak, float(loss), {"static_bytes": static, "saved_bytes": saved}


def measure_step(cfg: GPTConfig, micro_batch_size: int, warmup: int, iters: int,
                 attention: str = "math") -> dict:
    """Runs in a rank on one GPU: the timed steps, halving the micro batch on out-of-memory."""
    import gc

    import torch
    b = micro_batch_size
    while b >= 1:
        try:
            seconds, peak, loss, parts = _timed_steps(cfg, b, warmup, iters, attention)
            return {"micro_batch_size": b, "step_seconds": seconds, "peak_memory_bytes": peak,
                    "loss": loss} | (parts or {})
        except torch.OutOfMemoryError:
            pass
        gc.collect()                 # the failed step's tensors, now unreferenced
        torch.cuda.empty_cache()
        b //= 2
    return {"error": f"out of memory even at micro batch size 1 (asked {micro_batch_size})"}


def run(models: dict, micro_batch_size: int, warmup: int, iters: int, peak: float | None,
        backend: str = "nccl", say=print, attentions=("math",)) -> list:
    """Measure each model (name -> GPTConfig) and attention in its own one-rank launch; a row each."""
    from ..launcher import launch
    rows = []
    for name, cfg in models.items():
        for attention in attentions:
            say(f"gpu-check: {name} ({attention} attention): {cfg.num_parameters() / 1e6:.0f}M "
                f"parameters, micro batch {micro_batch_size} x {cfg.seq_length} tokens ...")
            try:
                [got] = launch(measure_step, 1, cfg, micro_batch_size, warmup, iters, attention,
                               backend=backend, timeout=1800)
            except Exception as e:  # noqa: BLE001 - one model's failure is a row of the report
                got = {"error": f"{type(e).__name__}: {str(e)[-2000:]}"}
            if "error" in got:
                rows.append({"model": name, "attention": attention, "error": got["error"]})
            else:
                row = summarize(name, cfg, got["micro_batch_size"], got["step_seconds"],
                                got["peak_memory_bytes"], peak, got.get("static_bytes"),
                                got.get("saved_bytes"), attention)
                rows.append(row | {"loss": got["loss"]})
            say(f"gpu-check: {name} ({attention}): {rows[-1].get('error') or _line(rows[-1])}")
    return rows


def _line(r) -> str:
    mfu = f"MFU {r['mfu']:.1%}" if r["mfu"] is not None else "MFU n/a (unknown peak)"
    mem = "n/a" if r["peak_memory_bytes"] is None else f"{r['peak_memory_bytes'] / 2**30:.2f}"
    return (f"{r['step_seconds'] * 1e3:.1f} ms/step, {mfu}, peak memory {mem} GiB "
            f"(calc {r['predicted_memory_bytes'] / 2**30:.2f})")

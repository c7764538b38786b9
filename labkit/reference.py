"""The single-device training loop, written plainly: what every parallel run must reproduce.

It shares only the model definition, the data and the configuration with ``labkit.train``: no
Engine, no microbatching, no process groups. Each iteration runs the whole global batch through
one forward and one backward, then one AdamW step. Parity tests compare ``labkit.train`` on N ranks
against this loop, so a bug in the parallel machinery cannot hide in the reference.

It takes the same arguments as ``labkit.train``, so a test passes one set of keyword arguments to
both. The layout fields are used for three things only, each what the parallel run sees too: the
default global batch (``micro_batch_size * dp``), the vocabulary padding (Megatron pads to a
multiple of ``make_vocab_size_divisible_by * tp``) and, for a MoE with a capacity factor under
TP + SP, the expert capacity counted over each tp rank's s/tp positions (``moe_routing_groups``).
"""
from __future__ import annotations

import torch

from . import data
from .config import train_config
from .indexed_dataset import get_batch
from .model import GPT
from .moe import moe_layers
from .moe_stats import attach, stats_table, summarize


def train_reference(world_size: int = 1, steps: int = 10, seed: int = 0, capture_grads: bool = False,
                    return_model: bool = False, probe=None, weights: dict | None = None,
                    moe_routing_groups: int | None = None, **config):
    """Losses of ``steps`` iterations on one device; arguments as for ``labkit.train``.

    Returns the list of losses, or a dict {"losses", "grad_norms", "grads" (after step 1, if
    ``capture_grads``), "model" (if ``return_model``), "moe" (MoE: the logged values per step,
    as ``labkit.train`` reports them), "probe"} when any is asked for. ``probe(model)``: makes a
    probe (``labkit.debug``) told ``begin(iteration)`` before each iteration and ``end()`` after the last.
    ``weights``: a dense state dict the model starts from instead of its seeded initialization.
    ``moe_routing_groups``: slices of the sequence each MoE capacity is counted over (None: the
    layout's, tp under sequence parallelism, else 1; labkit.fuzz passes it for a one-rank reference).

    A MoE model routes each microbatch on its own, as Megatron does on one GPU with gradient
    accumulation: the load-balancing loss and the expert capacity are per microbatch (its
    ``micro_batch_size`` sequences), so the loop runs the global batch microbatch by microbatch,
    each loss / m, and gives the aux losses the same 1 / m (the routers' ``aux_loss_scale``).
    """
    cfg = train_config(**config)
    topo = cfg.validate(world_size)
    if weights is not None and (cfg.bf16 or cfg.fp16):
        raise ValueError("weights= starts the float32/float64 reference only")
    if cfg.bf16 or cfg.fp16:                # one thread, as labkit's ranks: a CPU kernel's reduction
        threads = torch.get_num_threads()   # order (so a 16-bit gradient's rounding) follows it
        torch.set_num_threads(1)
        try:
            return _train_16bit(cfg, topo, steps, seed, capture_grads, return_model)
        finally:
            torch.set_num_threads(threads)
    model = GPT(cfg.model_config(), seed=seed).to(getattr(torch, cfg.params_dtype))
    if weights is not None:     # start from given dense weights (labkit.interop: imported ones)
        model.load_state_dict(weights)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(cfg.adam_beta1, cfg.adam_beta2),
                            eps=cfg.adam_eps, weight_decay=cfg.weight_decay)
    tokens = data.load_tokens() if cfg.data_path is None else None
    gbs = cfg.global_batch(topo)
    losses, norms, grads, moe = [], [], None, []
    m = gbs // cfg.micro_batch_size if cfg.num_experts is not None else 1
    if cfg.fp8 is not None:     # FP8: one scale per tensor of a global microbatch (mbs x dp samples,
        from .fp8.linear import FP8Recipe, apply     # what the amax reduction over dp makes one)
        apply([model], FP8Recipe.from_config(cfg))
        m = gbs // (cfg.micro_batch_size * topo.dp)
    # FP8: backpropagate what a dp (x cp) rank does (its own mean, d times the global one; Megatron
    # averages the gradients after the backward), so each gradient's amax is the same and a scale
    # starting at 1 (delayed) flushes the same subnormals; the gradients are divided back after
    k = topo.dp * topo.cp if cfg.fp8 is not None else 1     # (cp: each rank its tokens' mean too)
    groups = moe_routing_groups or (topo.tp if cfg.sequence_parallel else 1)
    for layer in moe_layers(model):
        layer.router.aux_loss_scale = 1.0 / m
        layer.router.routing_groups = groups
    attach(model)                       # the MoE values labkit.train logs
    probe = probe(model) if probe is not None else None
    for it in range(steps):
        if probe is not None:
            probe.begin(it)
        if cfg.data_path is None:
            inputs, labels = data.get_batch(tokens, it, gbs, cfg.seq_length, seed)
        else:  # Megatron's GPTDataset over cfg.data_path, as labkit.train reads it
            inputs, labels = get_batch(cfg.data_path, it, gbs, cfg.seq_length, seed, steps * gbs)
        opt.zero_grad(set_to_none=True)
        loss = 0.0
        for x, y in zip(inputs.chunk(m), labels.chunk(m)):   # m = 1 for a dense model
            mb_loss = model.loss(x, y) / m
            (mb_loss * k if k != 1 else mb_loss).backward()
            loss = loss + mb_loss.detach()
        for p in model.parameters() if k != 1 else ():
            p.grad /= k
        if cfg.num_experts is not None:
            moe.append(summarize(stats_table(model, cfg.num_layers, cfg.num_experts), cfg, 1, 1, m))
        if capture_grads and it == 0:
            grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
        norms.append(float(torch.linalg.vector_norm(
            torch.stack([p.grad.double().norm() for p in model.parameters()]))))
        if cfg.clip_grad > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip_grad)
        opt.step()
        losses.append(loss.item())
    if not (capture_grads or return_model or probe is not None):
        return losses
    out = {"losses": losses, "grad_norms": norms, "grads": grads,
           "moe": moe if cfg.num_experts is not None else None,
           "probe": probe.end() if probe is not None else None}
    if return_model:
        out["model"] = model
    return out


def _train_16bit(cfg, topo, steps: int, seed: int, capture_grads: bool, return_model: bool):
    """Mixed precision on one device, written plainly (Megatron on one GPU with gradient
    accumulation): the model in bf16/fp16, each microbatch's loss (x a constant loss scale under
    fp16) backpropagated in 16-bit, its gradients added into a per-parameter main gradient (fp32,
    or fp16 under fp16 without ``accumulate_allreduce_grads_in_fp32``), unscaled, clipped, one AdamW
    step on fp32 master copies, cast back into the 16-bit model. ``grad_abs_sums`` (after step 1):
    per parameter, the sum over microbatches of |microbatch gradient| (float64), from which a test
    bounds the accumulation error (Higham's summation bound)."""
    sixteen = torch.bfloat16 if cfg.bf16 else torch.float16
    acc = torch.float32 if cfg.bf16 or cfg.accumulate_allreduce_grads_in_fp32 else torch.float16
    scale = (cfg.loss_scale or cfg.initial_loss_scale) if cfg.fp16 else 1.0
    model = GPT(cfg.model_config(), seed=seed).to(sixteen)
    params = list(model.parameters())
    masters = [p.detach().float().clone().requires_grad_() for p in params]
    opt = torch.optim.AdamW(masters, lr=cfg.lr, betas=(cfg.adam_beta1, cfg.adam_beta2),
                            eps=cfg.adam_eps, weight_decay=cfg.weight_decay)
    tokens = data.load_tokens() if cfg.data_path is None else None
    gbs = cfg.global_batch(topo)
    m = gbs // cfg.micro_batch_size
    losses, norms, grads, abs_sums = [], [], None, None
    for it in range(steps):
        inputs, labels = data.get_batch(tokens, it, gbs, cfg.seq_length, seed)
        main = [torch.zeros_like(p, dtype=acc) for p in params]
        absum = [torch.zeros_like(p, dtype=torch.float64) for p in params]
        loss = 0.0
        for x, y in zip(inputs.chunk(m), labels.chunk(m)):
            mb_loss = model.loss(x, y) / m
            (mb_loss * scale).backward()
            for g, a, p in zip(main, absum, params):
                g.add_(p.grad)
                a.add_(p.grad.double().abs())
                p.grad = None
            loss = loss + mb_loss.detach().double()
        main = [g.float() / scale for g in main]
        if not all(bool(torch.isfinite(g).all()) for g in main):
            raise ValueError(f"loss scale {scale} overflows the fp16 gradients at iteration {it + 1}: "
                             f"the reference keeps a constant scale; choose a smaller loss_scale")
        if capture_grads and it == 0:
            names = [n for n, _ in model.named_parameters()]
            grads = dict(zip(names, [g.clone() for g in main]))
            abs_sums = dict(zip(names, [a / scale for a in absum]))
        norm = float(torch.linalg.vector_norm(torch.stack([g.double().norm() for g in main])))
        norms.append(norm)
        if cfg.clip_grad > 0 and norm > cfg.clip_grad:
            main = [g * (cfg.clip_grad / (norm + 1e-6)) for g in main]
        for w, g in zip(masters, main):
            w.grad = g
        opt.step()
        with torch.no_grad():
            for p, w in zip(params, masters):
                p.copy_(w)
        losses.append(float(loss))
    if not (capture_grads or return_model):
        return losses
    out = {"losses": losses, "grad_norms": norms, "grads": grads, "grad_abs_sums": abs_sums, "moe": None}
    if return_model:
        out["model"] = model
    return out

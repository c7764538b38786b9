"""The single-device training loop, written plainly: what every parallel run must reproduce.

It shares only the model definition, the data and the configuration with ``labkit.train``: no
Engine, no microbatching, no process groups. Each iteration runs the whole global batch through
one forward and one backward, then one AdamW step. Parity tests compare ``labkit.train`` on N ranks
against this loop, so a bug in the parallel machinery cannot hide in the reference.

It takes the same arguments as ``labkit.train``, so a test passes one set of keyword arguments to
both. The layout fields are used for two things only, each what the parallel run sees too: the
default global batch (``micro_batch_size * dp``) and the vocabulary padding (Megatron pads to a
multiple of ``make_vocab_size_divisible_by * tp``).
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
                    return_model: bool = False, probe=None, **config):
    """Losses of ``steps`` iterations on one device; arguments as for ``labkit.train``.

    Returns the list of losses, or a dict {"losses", "grad_norms", "grads" (after step 1, if
    ``capture_grads``), "model" (if ``return_model``), "moe" (MoE: the logged values per step,
    as ``labkit.train`` reports them), "probe"} when any is asked for. ``probe(model)``: makes a
    probe (``labkit.debug``) told ``begin(iteration)`` before each iteration and ``end()`` after the last.

    A MoE model routes each microbatch on its own, as Megatron does on one GPU with gradient
    accumulation: the load-balancing loss and the expert capacity are per microbatch (its
    ``micro_batch_size`` sequences), so the loop runs the global batch microbatch by microbatch,
    each loss / m, and gives the aux losses the same 1 / m (the routers' ``aux_loss_scale``).
    """
    cfg = train_config(**config)
    topo = cfg.validate(world_size)
    model = GPT(cfg.model_config(), seed=seed).to(getattr(torch, cfg.params_dtype))
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(cfg.adam_beta1, cfg.adam_beta2),
                            eps=cfg.adam_eps, weight_decay=cfg.weight_decay)
    tokens = data.load_tokens() if cfg.data_path is None else None
    gbs = cfg.global_batch(topo)
    losses, norms, grads, moe = [], [], None, []
    m = gbs // cfg.micro_batch_size if cfg.num_experts is not None else 1
    for layer in moe_layers(model):
        layer.router.aux_loss_scale = 1.0 / m
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
            mb_loss.backward()
            loss = loss + mb_loss.detach()
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

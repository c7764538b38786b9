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
from .model import GPT


def train_reference(world_size: int = 1, steps: int = 10, seed: int = 0, capture_grads: bool = False,
                    return_model: bool = False, **config):
    """Losses of ``steps`` iterations on one device; arguments as for ``labkit.train``.

    Returns the list of losses, or a dict {"losses", "grad_norms", "grads" (after step 1, if
    ``capture_grads``), "model" (if ``return_model``)} when either is asked for.
    """
    cfg = train_config(**config)
    topo = cfg.validate(world_size)
    model = GPT(cfg.model_config(), seed=seed).to(getattr(torch, cfg.params_dtype))
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(cfg.adam_beta1, cfg.adam_beta2),
                            eps=cfg.adam_eps, weight_decay=cfg.weight_decay)
    tokens = data.load_tokens()
    gbs = cfg.global_batch(topo)
    losses, norms, grads = [], [], None
    for it in range(steps):
        inputs, labels = data.get_batch(tokens, it, gbs, cfg.seq_length, seed)
        loss = model.loss(inputs, labels)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if capture_grads and it == 0:
            grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
        norms.append(float(torch.linalg.vector_norm(
            torch.stack([p.grad.double().norm() for p in model.parameters()]))))
        if cfg.clip_grad > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip_grad)
        opt.step()
        losses.append(loss.item())
    if not (capture_grads or return_model):
        return losses
    out = {"losses": losses, "grad_norms": norms, "grads": grads}
    if return_model:
        out["model"] = model
    return out

"""The single-device training loop, written plainly: what every parallel run must reproduce.

It shares only the model definition, the data and the configuration with ``labkit.train``: no
Engine, no microbatching, no process groups. Each iteration runs the whole global batch through
one forward and one backward, then one AdamW step. Parity tests compare ``labkit.train`` on N ranks
against this loop, so a bug in the parallel machinery cannot hide in the reference.
"""
from __future__ import annotations

import torch

from . import data
from .model import GPT
from .training import TrainConfig


def train_reference(steps: int = 10, seed: int = 0, tp_vocab_padding: int = 1,
                    return_model: bool = False, **config):
    """Losses of ``steps`` iterations on one device; ``**config`` as for ``labkit.train``.

    ``tp_vocab_padding``: the vocabulary is padded as for that TP size (Megatron pads to a
    multiple of ``make_vocab_size_divisible_by * tp``), so a TP run compares with the same model.
    """
    cfg = TrainConfig(**config)
    dtype = getattr(torch, cfg.params_dtype)
    model = GPT(cfg.model_config(tp=tp_vocab_padding), seed=seed).to(dtype)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(cfg.adam_beta1, cfg.adam_beta2),
                            eps=cfg.adam_eps, weight_decay=cfg.weight_decay)
    tokens = data.load_tokens()
    gbs = cfg.global_batch_size or cfg.micro_batch_size
    losses = []
    for it in range(steps):
        inputs, labels = data.get_batch(tokens, it, gbs, cfg.seq_length, seed)
        loss = model.loss(inputs, labels)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if cfg.clip_grad > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip_grad)
        opt.step()
        losses.append(loss.item())
    return (losses, model) if return_model else losses

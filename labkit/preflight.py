"""Checks ``labkit.train`` runs before any process starts: what a rank would otherwise find out alone.

``TrainConfig.validate`` has checked the layout (Megatron's rules, labkit's refusals) and every
field's type and range (``labkit.calc.hyperparams``). Left for here, because they need the data
or the machine:

* ``train``'s own arguments: ``seed`` (an int the samplers take), ``log_interval``;
* the data against the sequence: the shipped corpus must be longer than ``seq_length + 1`` tokens
  (``labkit.data.get_batch``), an indexed dataset must hold at least 2 tokens (its sampler repeats
  epochs as Megatron's GPTDataset does);
* what one rank will hold, per labkit.calc (:func:`rank_memory_bytes`), which ``launch`` sets
  against the machine with the world size (``launch_collect.check_capacity``).

Each refusal is a ValueError naming the argument and the numbers.
"""
from __future__ import annotations

import os

from .calc.config import PrecisionConfig
from .calc.hyperparams import check_run_arguments
from .calc.memory import memory_per_stage
from .config import TrainConfig


def data_tokens(cfg: TrainConfig) -> int:
    """Tokens the run samples from: the shipped corpus (one byte, one token) or the indexed
    dataset's sequences (read from its index, checked against the .bin)."""
    if cfg.data_path is None:
        from .data import CORPUS
        return os.path.getsize(CORPUS)
    from .indexed_dataset import read_indexed_dataset
    return int(read_indexed_dataset(cfg.data_path).sequence_lengths.sum())


def rank_memory_bytes(cfg: TrainConfig, world_size: int) -> float:
    """Bytes the fullest rank holds at its peak per labkit.calc: parameters, gradients, AdamW's two
    moments (all in ``params_dtype``) and activations, with the attention labkit's kernels keep
    (the dense softmax at CP 1, blockwise under CP). A lower bound: no allocator slack, no
    temporaries of the backward."""
    b = 8 if cfg.params_dtype == "float64" else 4
    model, par = cfg.megatron_view(world_size)
    rows = memory_per_stage(model, par, PrecisionConfig(b, b, 2 * b, b, cfg.params_dtype),
                            dropout=cfg.hidden_dropout > 0 or cfg.attention_dropout > 0,
                            attention="math" if par.cp == 1 else "flash")
    return max(r["total"] for r in rows)


def preflight(cfg: TrainConfig, world_size: int, seed=0, log_interval=1) -> float:
    """Run the checks above for ``train``; return :func:`rank_memory_bytes` for ``launch``."""
    check_run_arguments(seed=seed, log_interval=log_interval)
    tokens = data_tokens(cfg)
    if cfg.data_path is None and tokens <= cfg.seq_length + 1:
        raise ValueError(f"seq_length {cfg.seq_length}: the corpus has {tokens} tokens, a sample needs "
                         f"seq_length + 1 = {cfg.seq_length + 1} and a choice of start; use a shorter "
                         f"sequence or data_path (an indexed dataset)")
    if cfg.data_path is not None and tokens < 2:
        raise ValueError(f"data_path {cfg.data_path!r} holds {tokens} tokens; a sample needs at least 2")
    return rank_memory_bytes(cfg, world_size)

"""Bridges to real Megatron-LM: a labkit configuration as ``pretrain_gpt.py`` flags, and Megatron's
training log as a pandas table (chapter "Planning a run", moving to Megatron-LM).

    flags = to_flags(TrainConfig(tensor_model_parallel_size=2), steps=100)
    # ['--tensor-model-parallel-size', '2', '--num-layers', '2', ..., '--train-iters', '100']
    df = parse_log(open("train.log").read())   # one row per "iteration N/ M | ..." line

labkit's configuration fields are Megatron's argument names, so the export is mechanical; the
parser reads both Megatron's lines (with their "[date time]" prefix) and ``labkit.train``'s.
"""
from __future__ import annotations

import dataclasses
import re

from .training import TrainConfig

# fields that are labkit's own (no Megatron flag of that name) or need translating
_NOT_MEGATRON = {"params_dtype", "zero_stage"}

# "iteration        3/      10 | consumed samples: ... |" -> named fields
_FIELDS = {
    "consumed samples": ("consumed_samples", int),
    "elapsed time per iteration (ms)": ("elapsed_ms", float),
    "learning rate": ("learning_rate", float),
    "global batch size": ("global_batch_size", int),
    "lm loss": ("lm_loss", float),
    "loss scale": ("loss_scale", float),
    "grad norm": ("grad_norm", float),
    "number of skipped iterations": ("skipped_iterations", int),
    "number of nan iterations": ("nan_iterations", int),
}
_ITER = re.compile(r"iteration\s+(\d+)\s*/\s*(\d+)\s*\|(.*)$")
_STAMP = re.compile(r"^\s*\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)\]")


def to_flags(config: TrainConfig | dict, steps: int | None = None) -> list[str]:
    """``pretrain_gpt.py`` flags for a labkit configuration (model, batch, optimizer, parallelism;
    the data and tokenizer flags are the user's). Fields at a default Megatron shares are left out.

    ``zero_stage`` has no Megatron flag: stage 1 is ``--use-distributed-optimizer`` (which also
    reduce-scatters gradients, like stage 2); stage 3 has no Megatron equivalent and is refused.
    """
    cfg = TrainConfig(**config) if isinstance(config, dict) else config
    if cfg.zero_stage == 3:
        raise ValueError("zero_stage 3 (fully sharded parameters) has no Megatron-LM flag; "
                         "Megatron shards optimizer states and gradients (--use-distributed-optimizer)")
    flags = []
    for f in dataclasses.fields(TrainConfig):
        value = getattr(cfg, f.name)
        if f.name in _NOT_MEGATRON or value == f.default or value is None:
            continue
        flag = "--" + f.name.replace("_", "-")
        flags += [flag] if value is True else [flag, str(value)]
    if cfg.zero_stage in (1, 2) and "--use-distributed-optimizer" not in flags:
        flags.append("--use-distributed-optimizer")
    # flags Megatron needs, or whose Megatron default differs from labkit's (dropout 0.1 there,
    # clip_grad 1.0 there, lr has no default): always written out
    for name in ("num_layers", "hidden_size", "num_attention_heads", "seq_length", "micro_batch_size",
                 "lr", "clip_grad", "hidden_dropout", "attention_dropout"):
        flag = "--" + name.replace("_", "-")
        if flag not in flags:
            flags += [flag, str(getattr(cfg, name))]
    flags += ["--max-position-embeddings", str(cfg.seq_length)]
    if steps is not None:
        flags += ["--train-iters", str(steps)]
    return flags


def parse_line(line: str) -> dict | None:
    """One iteration line as a dict, or None if the line is not one."""
    m = _ITER.search(line)
    if m is None:
        return None
    row = {"iteration": int(m.group(1)), "train_iters": int(m.group(2))}
    stamp = _STAMP.match(line)
    if stamp:
        row["time"] = stamp.group(1)
    for part in m.group(3).split("|"):
        if ":" not in part:
            continue
        key, _, value = part.partition(":")
        key = key.strip()
        if key in _FIELDS:
            name, kind = _FIELDS[key]
            row[name] = kind(value.strip())
    return row


def parse_log(text: str):
    """Every iteration line of a Megatron (or labkit) log, as a pandas DataFrame in file order."""
    import pandas as pd
    rows = [r for r in map(parse_line, text.splitlines()) if r is not None]
    if not rows:
        raise ValueError("no Megatron iteration lines ('iteration N/ M | ...') in this text")
    return pd.DataFrame(rows)

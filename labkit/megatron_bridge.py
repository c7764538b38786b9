"""Bridges to real Megatron-LM: a labkit configuration as ``pretrain_gpt.py`` flags, and Megatron's
training log as pandas tables (chapter "Planning a run", moving to Megatron-LM).

    flags = to_flags(TrainConfig(tensor_model_parallel_size=2), steps=100)
    # ['--tensor-model-parallel-size', '2', '--num-layers', '2', ..., '--train-iters', '100']
    df = parse_log(open("train.log").read())      # one row per "iteration N/ M | ..." line
    mem = parse_memory(open("train.log").read())  # one row per "[Rank r] (...) memory (MB) | ..." line

labkit's configuration fields are Megatron's argument names, so the export is mechanical; every
flag written is checked against Megatron's own list (``labkit.calc.megatron_flags``, commit
d98e8a64). The parser reads the log formats of Megatron-LM today (``training_log`` in
megatron/training/training.py @ d98e8a64: "[date time.microseconds]" prefix, TFLOP/s per GPU),
Megatron-LM of 2021 (megatron/training.py @ 81ad628e: no time stamp), Megatron-DeepSpeed
(megatron/training.py @ 00caa0e9: samples per second, TFLOPs) and ``labkit.train``'s.
"""
from __future__ import annotations

import dataclasses
import re

from .training import TrainConfig

# fields that are labkit's own (no Megatron flag of that name) or need translating
_NOT_MEGATRON = {"params_dtype", "zero_stage", "pipeline_schedule"}

# ZeRO stage -> Megatron flags. Stage 1: the distributed optimizer (optimizer state sharded over
# DP; it also reduce-scatters the gradients). Stages 2 and 3: Megatron-FSDP with its sharding
# strategies "optim_grads" and "optim_grads_params" (arguments.py @ d98e8a64, choices no_shard,
# optim, optim_grads, optim_grads_params); Megatron-FSDP asserts --ckpt-format fsdp_dtensor.
ZERO_FLAGS = {
    1: ["--use-distributed-optimizer"],
    2: ["--use-megatron-fsdp", "--data-parallel-sharding-strategy", "optim_grads",
        "--ckpt-format", "fsdp_dtensor"],
    3: ["--use-megatron-fsdp", "--data-parallel-sharding-strategy", "optim_grads_params",
        "--ckpt-format", "fsdp_dtensor"],
}

# "key: value" fields of an iteration line -> (column, type); any other key is kept too
_FIELDS = {
    "consumed samples": ("consumed_samples", int),
    "consumed tokens": ("consumed_tokens", int),                      # Megatron-DeepSpeed
    "skipped samples": ("skipped_samples", int),
    "elapsed time per iteration (ms)": ("elapsed_ms", float),
    "throughput per GPU (TFLOP/s/GPU)": ("tflops_per_gpu", float),    # --log-throughput
    "energy per GPU (J/iter/GPU)": ("energy_j_per_gpu", float),
    "power per GPU (W/GPU)": ("power_w_per_gpu", float),
    "learning rate": ("learning_rate", float),
    "global batch size": ("global_batch_size", int),
    "lm loss": ("lm_loss", float),
    "loss scale": ("loss_scale", float),
    "grad norm": ("grad_norm", float),
    "num zeros": ("num_zeros", float),
    "params norm": ("params_norm", float),
    "actual seqlen": ("actual_seqlen", int),                          # Megatron-DeepSpeed
    "number of skipped iterations": ("skipped_iterations", int),
    "number of nan iterations": ("nan_iterations", int),
    "samples per second": ("samples_per_second", float),              # Megatron-DeepSpeed
    "tokens per gpu per second (tgs)": ("tokens_per_gpu_per_second", float),
    "TFLOPs": ("tflops_per_gpu", float),  # Megatron-DeepSpeed, per GPU (Narayanan et al. Eq. 3)
}
_MEMORY = {"allocated": "allocated_mb", "max allocated": "max_allocated_mb",
           "reserved": "reserved_mb", "max reserved": "max_reserved_mb",
           "total device memory used": "device_memory_used_mb"}
_ITER = re.compile(r"iteration\s+(\d+)\s*/\s*(\d+)\s*\|(.*)$")
_STAMP = re.compile(r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?)\]")
_MEM = re.compile(r"\[Rank (\d+)\]\s*(.*?)\s*memory \(MB\)\s*\|(.*)$")
_AFTER = re.compile(r"\(after (\d+) iterations\)")


def to_flags(config: TrainConfig | dict, steps: int | None = None) -> list[str]:
    """``pretrain_gpt.py`` flags for a labkit configuration (model, batch, optimizer, parallelism;
    the data and tokenizer flags are the user's). Fields at a default Megatron shares are left out.

    ``zero_stage`` has no Megatron flag of that name. Stage 1 is ``--use-distributed-optimizer``;
    stage 2 is Megatron-FSDP sharding optimizer state and gradients (``--use-megatron-fsdp
    --data-parallel-sharding-strategy optim_grads``), stage 3 also the parameters (``...
    optim_grads_params``); Megatron-FSDP also needs ``--ckpt-format fsdp_dtensor`` and
    CUDA_DEVICE_MAX_CONNECTIONS unset or > 1 (validate_args, arguments.py @ d98e8a64).
    """
    from .calc.megatron_args import FLAGS
    cfg = TrainConfig(**config) if isinstance(config, dict) else config
    flags = []
    for f in dataclasses.fields(TrainConfig):
        value = getattr(cfg, f.name)
        if f.name in _NOT_MEGATRON or value == f.default or value is None:
            continue
        if isinstance(value, bool):      # the switch storing this value (False: --disable-bias-linear)
            flags.append(_switch(f.name, value))
            continue
        flag = "--" + f.name.replace("_", "-")
        text = str(list(value)) if isinstance(value, tuple) else str(value)   # moe_layer_freq: "[0, 1]"
        flags += [flag, text]
    if cfg.pipeline_schedule not in (None, cfg.schedule_name()) or cfg.schedule_name() not in (
            "1f1b", "interleaved_1f1b"):
        raise ValueError(f"pipeline_schedule {cfg.pipeline_schedule!r}: Megatron-LM runs 1F1B, or its "
                         f"interleaved 1F1B when v > 1; it has no flag for another schedule")
    if cfg.zero_stage and not (cfg.zero_stage == 1 and "--use-distributed-optimizer" in flags):
        flags += ZERO_FLAGS[cfg.zero_stage]
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
    unknown = [f for f in flags if f.startswith("--") and f[2:] not in FLAGS]
    if unknown:
        raise ValueError(f"not Megatron-LM flags (arguments.py @ d98e8a64): {unknown}")
    return flags


def _switch(dest: str, value: bool) -> str:
    """The Megatron switch that stores ``value`` into ``args.dest`` (``--swiglu``; for
    ``add_bias_linear=False``, ``--disable-bias-linear``), from Megatron's own flag table."""
    from .calc.megatron_args import FLAGS
    same = dest.replace("_", "-")
    options = [f for f, (d, kind, stored) in FLAGS.items() if d == dest and kind == "switch" and stored == value]
    if not options:
        raise ValueError(f"{dest}={value}: Megatron-LM has no switch that sets it (arguments.py @ d98e8a64)")
    return "--" + (same if same in options else sorted(options)[0])


def _column(key: str) -> str:
    """An unknown field's column name: lower case, words joined by '_' ('mtp_1 loss' -> 'mtp_1_loss')."""
    return re.sub(r"[^0-9a-z]+", "_", key.lower()).strip("_")


def _value(text: str):
    """A field's value: int, float, or the text itself."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def _fields(parts, known: dict) -> dict:
    row = {}
    for part in parts:
        key, sep, value = part.partition(":")
        key, value = key.strip(), value.strip()
        if not sep or not key:
            continue
        if key in known:
            name, kind = known[key]
            row[name] = kind(value)
        else:
            row[_column(key)] = _value(value)
    return row


def parse_line(line: str) -> dict | None:
    """One iteration line as a dict (every field: known ones typed and named, others kept under a
    snake_case name), or None if the line is not one."""
    m = _ITER.search(line)
    if m is None:
        return None
    row = {"iteration": int(m.group(1)), "train_iters": int(m.group(2))}
    stamp = _STAMP.search(line[:m.start()])
    if stamp:
        row["time"] = stamp.group(1)
    return row | _fields(m.group(3).split("|"), _FIELDS)


def parse_memory_line(line: str) -> dict | None:
    """``[Rank r] (after N iterations) memory (MB) | allocated: ... | max reserved: ...`` as a dict."""
    m = _MEM.search(line)
    if m is None:
        return None
    after = _AFTER.search(m.group(2))
    row = {"rank": int(m.group(1)), "iteration": int(after.group(1)) if after else None,
           "report": m.group(2)}
    known = {k: (v, float) for k, v in _MEMORY.items()}
    return row | _fields(m.group(3).split("|"), known)


def parse_memory(text: str):
    """Every memory report of a log (one row per rank and report), as a pandas DataFrame."""
    import pandas as pd
    rows = [r for r in map(parse_memory_line, text.splitlines()) if r is not None]
    return pd.DataFrame(rows, columns=None if rows else ["rank", "iteration", "report"])


def parse_log(text: str, memory: bool = False):
    """Every iteration line of a Megatron (or labkit) log, as a pandas DataFrame in file order;
    with ``memory=True`` also the memory reports: ``(iterations, memory)``."""
    import pandas as pd
    rows = [r for r in map(parse_line, text.splitlines()) if r is not None]
    if not rows:
        raise ValueError("no Megatron iteration lines ('iteration N/ M | ...') in this text")
    df = pd.DataFrame(rows)
    return (df, parse_memory(text)) if memory else df

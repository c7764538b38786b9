"""Bridges to real Megatron-LM: a labkit configuration as ``pretrain_gpt.py`` flags, and Megatron's
training log as pandas tables (chapter "Planning a run", moving to Megatron-LM).

    flags = to_flags(TrainConfig(tensor_model_parallel_size=2), steps=100)
    # ['--tensor-model-parallel-size', '2', '--num-layers', '2', ..., '--train-iters', '100']
    df = parse_log(open("train.log").read())      # one row per "iteration N/ M | ..." line
    mem = parse_memory(open("train.log").read())  # one row per "[Rank r] (...) memory (MB) | ..." line
    log = parse_log(text, full=True)   # MegatronLog: iterations, memory, validation, timers, theory

``flags.py`` writes the flags (each checked against Megatron's own list, ``labkit.calc.megatron_flags``
@ d98e8a64; what they cannot say is listed in ``to_flags``); ``log.py`` reads the logs of Megatron-LM
today, of 2021, of Megatron-DeepSpeed and of ``labkit.train``.
"""
from __future__ import annotations

from .flags import ZERO_FLAGS, to_flags
from .log import (MegatronLog, parse_line, parse_log, parse_memory, parse_memory_line,
                  parse_theoretical_memory, parse_timers, parse_validation_line)

__all__ = ["to_flags", "ZERO_FLAGS", "parse_log", "parse_line", "parse_memory", "parse_memory_line",
           "parse_validation_line", "parse_theoretical_memory", "parse_timers", "MegatronLog"]

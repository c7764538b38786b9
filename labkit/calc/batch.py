"""Batch arithmetic (chapters "Data parallel" and "Pipeline parallel").

    data_parallel_size = world_size / (TP * PP * CP)
    num_microbatches   = global_batch_size / (micro_batch_size * DP)   (= gradient-accumulation steps)
    tokens per step    = global_batch_size * seq_length

Under pipeline parallelism the microbatches of one step ARE the gradient-accumulation steps
(Megatron-LM ``megatron/core/num_microbatches_calculator.py``: one number serves both).
"""
from __future__ import annotations

from .config import ModelConfig, ParallelConfig, validate, virtual_pipeline_size


def batch_math(model: ModelConfig, par: ParallelConfig) -> dict:
    """Everything the batch sizes determine; raises ValueError on a broken rule."""
    warnings = validate(model, par)
    dp = par.dp
    m = par.gbs // (par.micro_batch_size * dp)
    return {"world_size": par.world_size, "data_parallel_size": dp,
            "model_parallel_size": par.tp * par.pp, "global_batch_size": par.gbs,
            "micro_batch_size": par.micro_batch_size, "num_microbatches": m,
            "gradient_accumulation_steps": m,
            "virtual_pipeline_size": virtual_pipeline_size(model, par),
            "tokens_per_step": par.gbs * model.seq_length,
            "tokens_per_microbatch_per_gpu": par.micro_batch_size * model.seq_length // par.cp,
            "warnings": warnings}

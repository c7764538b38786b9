"""The precision rules of a TrainConfig (bf16 / fp16 / FP8), pure Python: checked by
``labkit.config`` before any process starts, and by ``labkit.fp8.FP8Recipe`` for its own values."""
from __future__ import annotations

from .validate import positive_int

FP8_FORMAT_NAMES = ("e4m3", "hybrid")      # Megatron's --fp8-format (hybrid: E5M2 gradients)
FP8_RECIPE_NAMES = ("tensorwise", "delayed", "blockwise", "mxfp8")   # Megatron's --fp8-recipe


def check_fp8(fp8_format, fp8_recipe, fp8_amax_history_len, fp8_amax_compute_algo, fp8_margin) -> None:
    """A ValueError naming the first FP8 argument that Megatron (and labkit) would not take."""
    if fp8_format not in FP8_FORMAT_NAMES:
        raise ValueError(f"fp8_format must be one of {sorted(FP8_FORMAT_NAMES)}, got {fp8_format!r}")
    if fp8_recipe not in FP8_RECIPE_NAMES:
        raise ValueError(f"fp8_recipe must be one of {list(FP8_RECIPE_NAMES)}, got {fp8_recipe!r}")
    if fp8_amax_compute_algo not in ("max", "most_recent"):
        raise ValueError(f"fp8_amax_compute_algo is 'max' or 'most_recent', not {fp8_amax_compute_algo!r}")
    if fp8_amax_history_len < 1 or fp8_margin < 0:
        raise ValueError("fp8_amax_history_len must be >= 1 and fp8_margin >= 0")


def check_precision(cfg) -> None:
    """bf16 / fp16: Megatron's rule (not both), and what labkit implements (fp32 master weights
    over plain DP or the distributed optimizer)."""
    if cfg.bf16 and cfg.fp16:
        raise ValueError("bf16 and fp16 are exclusive (Megatron's validate_args asserts not both)")
    sixteen = "bf16" if cfg.bf16 else "fp16" if cfg.fp16 else None
    if sixteen and cfg.params_dtype != "float32":
        raise ValueError(f"{sixteen} with params_dtype {cfg.params_dtype!r}: the master weights are fp32; "
                         f"leave params_dtype at 'float32'")
    if sixteen and cfg.zero_stage >= 2:
        raise ValueError(f"{sixteen} with zero_stage {cfg.zero_stage}: labkit keeps fp32 master weights with "
                         f"plain DP or the distributed optimizer (zero_stage 0 or 1), as Megatron's "
                         f"Float16Optimizer and DistributedOptimizer do")
    for name in ("initial_loss_scale", "min_loss_scale", "loss_scale_window"):
        if getattr(cfg, name) <= 0:
            raise ValueError(f"{name} must be > 0, got {getattr(cfg, name)!r}")
    if cfg.loss_scale is not None and cfg.loss_scale <= 0:
        raise ValueError(f"loss_scale must be > 0 (None: dynamic), got {cfg.loss_scale!r}")
    positive_int("hysteresis", cfg.hysteresis)
    if cfg.fp8 is not None:
        check_fp8(cfg.fp8, cfg.fp8_recipe, cfg.fp8_amax_history_len, cfg.fp8_amax_compute_algo,
                  cfg.fp8_margin)
        if sixteen:
            raise ValueError(f"fp8 with {sixteen}: labkit's FP8 emulation keeps everything but the "
                             f"linear layers' GEMMs in params_dtype (float32 or float64)")
    if cfg.fp8_param_gather:        # Megatron's --fp8-param-gather, as labkit implements it
        if cfg.fp8 is None or cfg.fp8_recipe not in ("tensorwise", "delayed"):
            raise ValueError("fp8_param_gather needs fp8 with a per-tensor recipe (tensorwise or delayed): "
                             "each rank quantizes its ZeRO shard alone, with the weight's one scale; a "
                             "flat shard cuts blockwise's 128x128 and MXFP8's 1x32 blocks")
        if cfg.zero_stage != 3:
            raise ValueError(f"fp8_param_gather with zero_stage {cfg.zero_stage}: labkit gathers FP8 "
                             f"parameters under ZeRO-3 only (zero_stage=3)")
        if cfg.recompute_granularity is not None:
            raise ValueError("fp8_param_gather with recompute: the recomputed forward gathers the weights "
                             "again, and labkit keeps one gathered scale per weight, not one per "
                             "microbatch in flight")

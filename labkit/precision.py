"""Precision in one place: the dtypes of a run and Megatron's loss scaling.

Chapter "Memory knobs". Megatron-LM's mixed precision (``--bf16`` / ``--fp16``; Micikevicius et
al. 2018, https://arxiv.org/abs/1710.03740), as labkit runs it on the CPU too:

    parameters and activations    16-bit (``params_dtype``), the forward and backward in it
    main_grad                     a gradient buffer per parameter (``main_grad_dtype``): fp32 under
                                  bf16 (Megatron forces ``accumulate_allreduce_grads_in_fp32``),
                                  16-bit under fp16 unless ``accumulate_allreduce_grads_in_fp32``;
                                  microbatches accumulate into it and DP reduces it at that width
    master weights and moments    fp32, in the optimizer (sharded by the distributed optimizer)
    loss scale                    fp16 only: the loss is multiplied by S before the backward and
                                  the gradients by 1/S after, so small gradients do not underflow;
                                  :class:`DynamicGradScaler` is Megatron's ``grad_scaler.py``

Bytes per parameter labkit holds (params + grads + optimizer): bf16 2 + 4 + 12 = 18, fp16 2 + 2 +
12 = 16, fp32 4 + 4 + 8 = 16; the distributed optimizer divides the 12 (or 8) by d
(``labkit.calc.memory.zero_memory_per_rank``). Megatron's ``--fp16`` holds 20 (4 + 16/d): its
optimizer steps on an fp32 copy of every main_grad (``labkit.calc.MEGATRON_FP16``); labkit's reads
the fp16 main_grad and unscales into a temporary (``labkit.calc.LABKIT_FP16``).
"""
from __future__ import annotations

import torch

SIXTEEN = {"bf16": torch.bfloat16, "fp16": torch.float16}


def mode(cfg) -> str | None:
    """"bf16", "fp16" or None (the run's ``params_dtype``, fp32 or fp64)."""
    return "bf16" if cfg.bf16 else "fp16" if cfg.fp16 else None


def params_dtype(cfg) -> torch.dtype:
    """The dtype of the model's parameters and activations."""
    m = mode(cfg)
    return SIXTEEN[m] if m else getattr(torch, cfg.params_dtype)


def main_grad_dtype(cfg) -> torch.dtype:
    """The dtype gradients accumulate and are reduced in (Megatron's grad buffer)."""
    m = mode(cfg)
    if m is None:
        return getattr(torch, cfg.params_dtype)
    if m == "bf16" or cfg.accumulate_allreduce_grads_in_fp32:
        return torch.float32
    return torch.float16


def upcast(x: torch.Tensor) -> torch.Tensor:
    """16-bit logits in fp32 for the cross-entropy (Megatron's, unless --fp16-lm-cross-entropy)."""
    return x.float() if x.dtype in (torch.bfloat16, torch.float16) else x


class ConstantGradScaler:
    """A fixed loss scale (Megatron's ``--loss-scale S``)."""

    def __init__(self, scale: float):
        self.scale = float(scale)

    def update(self, found_inf: bool) -> None:
        pass


class DynamicGradScaler:
    """Megatron's dynamic loss scale (``megatron/core/optimizer/grad_scaler.py``, d98e8a64): on a
    non-finite gradient the iteration is skipped and the hysteresis tracker drops by one; once
    ``hysteresis`` overflows have happened since the last growth (not necessarily in a row: a clean
    iteration does not restore the tracker, whatever Megatron's docstring says) the scale is
    multiplied by ``backoff_factor`` (not below ``min_scale``), and so is it at every later overflow;
    after ``growth_interval`` clean iterations in a row it is multiplied by ``growth_factor`` and the
    tracker is restored to ``hysteresis``."""

    def __init__(self, initial_scale: float, min_scale: float, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5, growth_interval: int = 1000, hysteresis: int = 2):
        self.scale, self.min_scale = float(initial_scale), float(min_scale)
        self.growth_factor, self.backoff_factor = growth_factor, backoff_factor
        self.growth_interval, self.hysteresis = growth_interval, hysteresis
        self._growth_tracker, self._hysteresis_tracker = 0, hysteresis

    def update(self, found_inf: bool) -> None:
        if found_inf:
            self._growth_tracker = 0
            self._hysteresis_tracker -= 1
            if self._hysteresis_tracker <= 0:
                self.scale = max(self.scale * self.backoff_factor, self.min_scale)
        else:
            self._growth_tracker += 1
            if self._growth_tracker == self.growth_interval:
                self._growth_tracker = 0
                self._hysteresis_tracker = self.hysteresis
                self.scale = self.scale * self.growth_factor


def make_scaler(cfg):
    """fp16: a constant scaler with ``loss_scale``, else Megatron's dynamic one; otherwise None
    (bf16 and fp32 need no loss scaling: the log shows ``loss scale: 1.0``)."""
    if not cfg.fp16:
        return None
    if cfg.loss_scale is not None:
        return ConstantGradScaler(cfg.loss_scale)
    return DynamicGradScaler(cfg.initial_loss_scale, cfg.min_loss_scale,
                             growth_interval=cfg.loss_scale_window, hysteresis=cfg.hysteresis)

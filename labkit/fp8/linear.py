"""FP8 at runtime: a linear layer's three GEMMs in FP8, fp32 (or float64) master weights.

Megatron-LM's ``--fp8-format e4m3|hybrid --fp8-recipe tensorwise|delayed|blockwise|mxfp8
--fp8-amax-history-len L --fp8-amax-compute-algo max|most_recent --fp8-margin M`` (Transformer
Engine's linear layers), emulated: each GEMM operand is quantized with the recipe, dequantized,
and multiplied in the activations' precision (fp32, or float64 in parity tests), which is what
``torch._scaled_mm`` does on the CPU. The parameters stay in high precision (the master weights);
only the transformer layers' linear layers (roles qkv, proj, fc1, fc2) run in FP8, as in Megatron.

    GEMM    operand A [rows, reduction]      operand B [cols, reduction]    format (hybrid)
    fprop   x    [T, K]                      w    [N, K]                    E4M3 x E4M3
    dgrad   dy   [T, N]                      w^T  [K, N]                    E5M2 x E4M3
    wgrad   dy^T [N, T]                      x^T  [K, T]                    E5M2 x E4M3

Blockwise and MXFP8 blocks run along each GEMM's reduction dim, so x, w and dy are quantized
twice ("rowwise" and "columnwise", as Transformer Engine does); a per-tensor scale serves both.

Amax reduction: a per-tensor scale must be the one a single device would compute from the WHOLE
tensor, so each amax is reduced (max) over ``amax_group``, the ranks that share the tensor. As
Megatron does (``get_amax_reduction_group``: tp x dp x cp), labkit reduces over every rank of the
pipeline stage: TP shards (a sharded weight, a row-parallel input, SP activations), DP and CP
shards of the batch. A routed expert's linears (roles expert_fc1/2) are shared by other ranks:
those holding the same expert (its etp shards, its edp replicas with their own tokens; Megatron's
one group would mix two experts' amaxes under EP). Block scales are local to a block and need no
reduction (blocks must not straddle shards). Without the reduction (``amax_group=None``) a parallel
run drifts from the one-device run: the negative control of tests/test_fp8_runtime.py.

Recompute (labkit.recompute): a recomputed forward must quantize with the scales of the first one
and leave delayed scaling's histories alone, so each first forward inside a recomputed region
queues its scales and the recomputation takes them back in the same order (Transformer Engine's
``fp8 activation recompute``): one history update per forward, as without recompute.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from ..precision_rules import FP8_RECIPE_NAMES, check_fp8
from ..recompute import PHASE
from .formats import FP8_FORMATS
from .scaling import (DelayedScaling, Quantized, current_scale, quantize_blockwise, quantize_mxfp8,
                      quantize_with_scale)

FP8_ROLES = ("qkv", "proj", "fc1", "fc2", "expert_fc1", "expert_fc2")
EXPERT_ROLES = ("expert_fc1", "expert_fc2")
RECIPES = FP8_RECIPE_NAMES
ROLES = ("input", "weight", "grad_output")


@dataclass(frozen=True)
class FP8Recipe:
    """Megatron's FP8 arguments (defaults: Megatron's, except fp8_format which turns FP8 on)."""
    fp8_format: str = "hybrid"
    fp8_recipe: str = "delayed"
    fp8_amax_history_len: int = 1
    fp8_amax_compute_algo: str = "most_recent"
    fp8_margin: int = 0

    def __post_init__(self):
        check_fp8(self.fp8_format, self.fp8_recipe, self.fp8_amax_history_len,
                  self.fp8_amax_compute_algo, self.fp8_margin)

    @classmethod
    def from_config(cls, cfg) -> "FP8Recipe | None":
        """The recipe of a TrainConfig, or None when its ``fp8`` (--fp8-format) is None (FP8 off)."""
        if getattr(cfg, "fp8", None) is None:
            return None
        return cls(cfg.fp8, cfg.fp8_recipe, cfg.fp8_amax_history_len,
                   cfg.fp8_amax_compute_algo, cfg.fp8_margin)


class LinearFP8:
    """One linear layer's quantizers: the formats of its recipe, delayed scaling's three histories
    (input, weight, grad_output), and the group its amaxes are reduced over."""

    def __init__(self, recipe: FP8Recipe, amax_group=None):
        self.recipe, self.amax_group = recipe, amax_group
        f = FP8_FORMATS[recipe.fp8_format]
        self.fmt = {"input": f["forward"], "weight": f["forward"], "grad_output": f["backward"]}
        self.delayed = {r: DelayedScaling(self.fmt[r], recipe.fp8_amax_history_len,
                                          recipe.fp8_amax_compute_algo, recipe.fp8_margin)
                        for r in ROLES} if recipe.fp8_recipe == "delayed" else None
        self.recompute_scales = deque()      # (role, scale) of first forwards in a recomputed region
        self.gathered_scale = None           # ZeRO-3 fp8_param_gather: the weight arrived quantized with it

    def amax(self, t: torch.Tensor) -> torch.Tensor:
        """max |t| over this rank's part, reduced (max) over the amax group."""
        a = t.detach().abs().amax().float().reshape(1) if t.numel() else t.new_zeros(1, dtype=torch.float32)
        g = self.amax_group
        if g is not None and g.size > 1:
            dist.all_reduce(a, op=dist.ReduceOp.MAX, group=g.pg)
        return a.reshape(())

    def pair(self, t: torch.Tensor, role: str) -> tuple[Quantized, Quantized]:
        """t [R, C] quantized for the GEMMs that reduce over C (rowwise) and over R (columnwise)."""
        fmt, recipe = self.fmt[role], self.recipe.fp8_recipe
        t = t.detach()
        if recipe in ("tensorwise", "delayed"):
            if role == "weight" and self.gathered_scale is not None:
                scale = self.gathered_scale                # weight_scale chose it (before the gather)
            elif recipe == "tensorwise":
                scale = current_scale(self.amax(t), fmt)
            elif PHASE.get() == "again":                   # recomputing: the first forward's scale
                r, scale = self.recompute_scales.popleft()
                assert r == role, f"recompute took back {r}'s scale for {role}"
            else:
                scale = self.delayed[role].scale           # from earlier amaxes only
                self.delayed[role].update(self.amax(t))
                if PHASE.get() == "first":
                    self.recompute_scales.append((role, scale))
            return quantize_with_scale(t, scale, fmt), quantize_with_scale(t.T, scale, fmt)
        if recipe == "mxfp8":
            return quantize_mxfp8(t, fmt), quantize_mxfp8(t.T.contiguous(), fmt)
        block = (128, 128) if role == "weight" else (1, 128)
        return quantize_blockwise(t, fmt, block), quantize_blockwise(t.T.contiguous(), fmt, block)

    def weight_scale(self, part: torch.Tensor) -> torch.Tensor:
        """The weight's scale from this rank's ``part`` of it (ZeRO-3 ``fp8_param_gather``: the shard
        is quantized with it before the gather): its amax reduced, delayed's history updated once,
        as ``pair`` does; ``pair`` then takes it instead (re-quantizing gives the same FP8 bytes)."""
        fmt, amax = self.fmt["weight"], self.amax(part)
        if self.recipe.fp8_recipe == "tensorwise":
            scale = current_scale(amax, fmt)
        else:
            scale = self.delayed["weight"].scale
            self.delayed["weight"].update(amax)
        self.gathered_scale = scale
        return scale

    def linear(self, x, w, b=None):
        """F.linear(x, w, b) with the GEMMs in FP8."""
        y = _FP8Linear.apply(x, w, self)
        return y if b is None else y + b


def _mm(a: Quantized, b: Quantized, dtype) -> torch.Tensor:
    """a [M, K] @ b [N, K]^T, dequantized in ``dtype`` (float64 stays float64, the rest fp32)."""
    work = torch.float64 if dtype == torch.float64 else torch.float32
    return (a.dequantize(work) @ b.dequantize(work).T).to(dtype)


class _FP8Linear(torch.autograd.Function):
    """y = x w^T with fprop, dgrad and wgrad in FP8 (table of the module docstring)."""

    @staticmethod
    def forward(ctx, x, w, fp8: LinearFP8):
        x2 = x.reshape(-1, x.shape[-1])                    # [T, K]
        qx, qxt = fp8.pair(x2, "input")
        qw, qwt = fp8.pair(w, "weight")
        ctx.fp8, ctx.shape, ctx.saved = fp8, x.shape, (qxt, qwt)
        return _mm(qx, qw, x.dtype).reshape(*x.shape[:-1], w.shape[0])

    @staticmethod
    def backward(ctx, dy):
        qxt, qwt = ctx.saved
        dy2 = dy.reshape(-1, dy.shape[-1])                 # [T, N]
        qdy, qdyt = ctx.fp8.pair(dy2, "grad_output")
        dx = _mm(qdy, qwt, dy.dtype).reshape(ctx.shape)    # dgrad [T, K]
        dw = _mm(qdyt, qxt, dy.dtype)                      # wgrad [N, K]
        return dx, dw, None


def fp8_or_linear(module, x, w, b=None):
    """F.linear, or ``module``'s FP8 GEMMs when ``apply`` gave it quantizers (``module.fp8``)."""
    fp8 = getattr(module, "fp8", None)
    return torch.nn.functional.linear(x, w, b) if fp8 is None else fp8.linear(x, w, b)


class FP8Linear(nn.Linear):
    """A dense nn.Linear whose GEMMs run in FP8 (``apply`` turns a model's linear layers into it)."""

    def forward(self, x):
        return self.fp8.linear(x, self.weight, self.bias)


def apply(chunks, recipe: FP8Recipe | None, amax_group=None, expert_group=None) -> int:
    """Give every linear layer of the FP8 roles its quantizers; returns how many. A dense
    nn.Linear becomes an FP8Linear; tensor-parallel layers call ``module.fp8`` themselves.
    A routed expert's amaxes are reduced over ``expert_group`` (None: ``amax_group``)."""
    if recipe is None:
        return 0
    n = 0
    for chunk in chunks:
        for module in chunk.modules():
            if getattr(module, "role", None) in FP8_ROLES:
                expert = module.role in EXPERT_ROLES and expert_group is not None
                module.fp8 = LinearFP8(recipe, expert_group if expert else amax_group)
                if type(module) is nn.Linear:
                    module.__class__ = FP8Linear
                n += 1
    return n


def amax_ranks(topo, tp_only: bool = False, expert: bool = False) -> list[list[int]]:
    """The amax-reduction groups as rank lists (pure: the Topology only): Megatron's
    ``get_amax_reduction_group``, the ranks of one pipeline stage (tp x cp x dp), or with
    ``tp_only`` (``--tp-only-amax-red``) those that differ in tp and cp only. ``expert``: on the
    expert grid, the ranks holding the same experts (etp x edp; ``tp_only``: etp)."""
    if expert:
        keep, coords = (("pp", "ep", "edp") if tp_only else ("pp", "ep")), topo.expert_coords
    else:
        keep, coords = (("pp", "dp") if tp_only else ("pp",)), topo.coords
    keys = {r: tuple(coords(r)[a] for a in keep) for r in range(topo.world_size)}  # equal: shared
    return [[r for r in range(topo.world_size) if keys[r] == key] for key in sorted(set(keys.values()))]


def amax_group(topo, tp_only: bool = False, expert: bool = False):
    """This rank's amax-reduction group (``amax_ranks``), every group made on every rank in order."""
    from ..groups import new_group
    mine = None
    for ranks in amax_ranks(topo, tp_only, expert):
        g = new_group("expert_amax" if expert else "amax", ranks)
        mine = g if dist.get_rank() in ranks else mine
    return mine

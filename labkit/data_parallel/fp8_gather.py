"""ZeRO-3 with FP8 parameter all-gather: Megatron-LM's ``--fp8-param-gather`` (``fp8_param_gather``).

Chapter "Low precision". Under ZeRO-3 every microbatch gathers each layer's weights twice (forward
and backward). The FP8 linears quantize their weight anyway, so each rank can quantize its SHARD
before the gather and send 1 byte per element instead of 4 (fp32) or 8 (float64):

    forward gather    per FP8 weight: amax of this rank's part, reduced (max) over the linear's
                      amax group (``LinearFP8.weight_scale``: tensorwise's scale, or delayed's, its
                      history updated once, as the linear would); part -> FP8 bytes; all-gather
                      the bytes (uint8); dequantize into the unit's buffer
    backward gather   the same, with the forward's scales (no amax, no history update)
    the linear        re-quantizes the gathered weight with the same scale: the same FP8 bytes
                      (q * (1/s) * s rounds back to q), so the run equals the one-device FP8 run

The scale is the same on every rank (it comes from the reduced amax), so it is not gathered; the
amax all-reduce (4 bytes per weight) is uncounted, as the linears' own amax reductions are. The
other parameters (norms, biases, embedding, router) are gathered in their own precision, in units
of their own: a layer is two units, "layer k fp8" (its FP8 weights) and "layer k" (the rest).
Bytes per step: ``labkit.calc.comm.dp_step_bytes(..., gather_bytes=fp8_gather_bytes(E, R))``.
The master weights (the shards the optimizer steps) stay in high precision.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from ..fp8.formats import cast
from ..fp8.linear import LinearFP8
from ..recompute import PHASE
from .fsdp import Unit, ZeRO3PerLayer


class ZeRO3FP8Gather(ZeRO3PerLayer):
    """ZeRO-3 by layer whose FP8 linears' weights travel as FP8 bytes (1 per element)."""

    def __init__(self, named_params, group, cfg, module=None):
        chunks = module if isinstance(module, (list, tuple)) else [module]
        self.quantizer = {id(m.weight): m.fp8 for c in chunks for m in c.modules()
                          if isinstance(getattr(m, "fp8", None), LinearFP8) and isinstance(m.weight, torch.nn.Parameter)}
        self.split = lambda p: id(p) in self.quantizer
        self.fresh = True                  # a forward gather (new scales) or a backward one (reused)
        super().__init__(named_params, group, cfg, module)

    def _quantized_shard(self, u: Unit) -> torch.Tensor:
        """This rank's shard of ``u`` as FP8 bytes [hi - lo] (uint8); remembers each weight's scale."""
        out = torch.zeros(u.hi - u.lo, dtype=torch.uint8, device=u.shard.device)
        u.scales = [] if self.fresh or not hasattr(u, "scales") else u.scales
        for k, (p, a, b) in enumerate(zip(u.params, u.layout.offsets, u.layout.offsets[1:])):
            fp8 = self.quantizer[id(p)]
            lo, hi = max(a, u.lo) - u.lo, min(b, u.hi) - u.lo
            part = u.shard.detach()[lo:max(lo, hi)]
            if self.fresh:
                u.scales.append(fp8.weight_scale(part))
            fp8.gathered_scale = u.scales[k]
            if hi > lo:
                out[lo:hi] = cast(part.float() * u.scales[k].float(), fp8.fmt["weight"]).view(torch.uint8)
        return out

    def _issue(self, u: Unit) -> None:
        if not u.name.endswith(" fp8"):
            return super()._issue(u)
        if u.gathered or u.work is not None:
            return
        u.flat.untyped_storage().resize_(u.full_bytes)
        shard, n = self._quantized_shard(u), self.group.size
        u.bytes = torch.empty(u.layout.padded_numel, dtype=torch.uint8, device=shard.device)
        if n == 1:
            u.bytes.copy_(shard)
        else:
            self.group.stats.add("all_gather", (n - 1) / n * u.bytes.numel())
            u.work = dist.all_gather_into_tensor(u.bytes, shard, group=self.group.pg, async_op=True)
        u.dequantize = True
        self._sample("gather", u)

    def _wait(self, u: Unit) -> None:
        super()._wait(u)
        if getattr(u, "dequantize", False):       # FP8 bytes -> the unit's buffer (x = q / scale)
            with torch.no_grad():
                for p, a, b, s in zip(u.params, u.layout.offsets, u.layout.offsets[1:], u.scales):
                    fmt = self.quantizer[id(p)].fmt["weight"]
                    u.flat[a:b] = u.bytes[a:b].view(fmt.dtype).to(u.flat.dtype) * (1.0 / s).to(u.flat.dtype)
            u.bytes, u.dequantize = None, False

    def _before_forward(self, u: Unit, first: bool) -> None:
        self.fresh = PHASE.get() != "again"
        super()._before_forward(u, first)

    def _before_backward(self, u: Unit) -> None:
        self.fresh = False
        super()._before_backward(u)

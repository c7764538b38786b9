"""FP8 training, emulated exactly on the CPU (chapter "FP8: four ways to scale").

    formats.py   E4M3 / E5M2 / E8M0: max, unit roundoff, the saturating cast
    scaling.py   the four recipes: tensorwise (current), delayed (amax history), blockwise
                 (1x128 / 128x128), mxfp8 (1x32, E8M0 scales); a Quantized tensor
    gemm.py      the FP8 GEMM: dequantize-multiply (= torch._scaled_mm on the CPU) and the
                 blockwise-exact tensor-core emulation with a limited accumulator promoted every 128
    linear.py    an FP8 linear layer's three GEMMs (fprop, dgrad, wgrad) with fp32 master weights,
                 each tensorwise amax reduced (max) over the ranks that share the tensor
"""
from .formats import E4M3, E5M2, E8M0, FORMATS, FP8_FORMATS, Format, cast, round_to
from .gemm import accumulation_error, dequantize_gemm, gemm, truncate_mantissa
from .scaling import (DelayedScaling, Quantized, current_scale, delayed_scale, quantize_blockwise,
                      quantize_mxfp8, quantize_tensorwise, quantize_with_scale)

RECIPES = ("tensorwise", "delayed", "blockwise", "mxfp8")

__all__ = ["E4M3", "E5M2", "E8M0", "FORMATS", "FP8_FORMATS", "Format", "cast", "round_to",
           "accumulation_error", "dequantize_gemm", "gemm", "truncate_mantissa", "DelayedScaling",
           "Quantized", "current_scale", "delayed_scale", "quantize_blockwise", "quantize_mxfp8",
           "quantize_tensorwise", "quantize_with_scale", "RECIPES"]

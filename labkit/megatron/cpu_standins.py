"""CPU stand-ins: what it takes to run Megatron-Core 0.16.1 (its local, non-Transformer-Engine
layer spec) on CPU gloo ranks, installed only inside a rank process of a Megatron run and removed
after it (:func:`cpu_standins`), and never on a machine with CUDA (there Megatron runs as shipped).

Each stand-in names the Megatron site it replaces and why. None changes the arithmetic, except
the three marked FLOAT64: Megatron computes the cross-entropy, the gradient norm and the MoE
router's softmax in fp32 by design; for a float64 oracle they keep float64 (fp32/bf16 inputs are
computed exactly as before).

    site (megatron/core/...)                                 why on the CPU
    tensor_parallel/random.py  CudaRNGStatesTracker          torch.cuda.get/set_rng_state: CPU generator
    torch.cuda.current_device (factories all over)           device=0 means cuda:0; the CPU instead
    device="cuda" factories (optimizer/optimizer.py, transformer/utils.py's causal mask,
      pipeline_parallel/schedules.py, ...: _CUDA_FACTORY_MODULES)   made on the CPU
    tensor_parallel/cross_entropy.py calculate_logits_max    FLOAT64: .float() would drop to fp32
    optimizer/clip_grads.py get_grad_norm_fp32, clip_...     FLOAT64 L2; device="cuda" buffers,
                                                             'torch.cuda.FloatTensor' type asserts
    transformer/moe/moe_utils.py softmax(..., dtype=fp32)    FLOAT64: a float64 router's scores stay
                                                             float64 (top-k probabilities, aux loss)
    Tensor.type() (optimizer/distrib_optimizer.py)           'torch.FloatTensor' on the CPU
    Tensor.cuda() (language_module.py, tied output layer)    the tensor stays on the CPU
    torch.cuda.Stream / Event (moe/token_dispatcher.py)      inert: one stream on the CPU
    transformer/moe/token_dispatcher.py                      split sizes as numpy on the CPU too: the
      maybe_move_tensor_to_cpu(as_numpy=True)                  CUDA path's host copy; a CPU tensor is
                                                             left a tensor, which all_to_all refuses
    tensor_parallel/mappings.py torch.distributed.all_gather gloo refuses uneven pieces (the all-to-all
      / reduce_scatter with split sizes                      dispatcher's expert-TP gather of tokens
                                                             per rank): one broadcast / reduce per
                                                             rank instead, the same values
    transformer/moe/moe_utils.py te_general_gemm             undefined without Transformer Engine
                                                             (its import sits in a try): None, what
                                                             the router's "is not None" test means
"""
from __future__ import annotations

import contextlib
import math

import torch
import torch.distributed as dist


class CPURNGTracker:
    """``tensor_parallel.random.CudaRNGStatesTracker`` on the CPU generator: named states
    (Megatron's "model-parallel-rng", "expert-parallel-rng", "data-parallel-rng") forked around a
    region exactly as the CUDA tracker forks the device generator (``fork``: swap in, run, save
    back, restore). Megatron's own tracker calls torch.cuda.get_rng_state, absent on the CPU."""

    def __init__(self, *args, **kwargs):
        self.states_, self.seeds_ = {}, set()
        self._current_state_name = "default-rng"

    def is_initialized(self):
        return bool(self.states_)

    def reset(self):
        self.states_, self.seeds_ = {}, set()

    def get_states(self):
        return dict(self.states_)

    def set_states(self, states):
        self.states_ = dict(states)

    def add(self, name, seed):
        if name in self.states_:
            raise Exception(f"rng state {name} already exists")
        self.seeds_.add(seed)
        self.states_[name] = torch.Generator().manual_seed(seed).get_state()

    @contextlib.contextmanager
    def fork(self, name="model-parallel-rng"):
        orig = torch.get_rng_state()
        torch.set_rng_state(self.states_[name])
        try:
            yield
        finally:
            self.states_[name] = torch.get_rng_state()
            torch.set_rng_state(orig)


class _CPUTorch:
    """The ``torch`` a Megatron module sees (its global name ``torch``), in the modules that make
    tensors with a hard-coded ``device="cuda"`` (or ``torch.cuda.current_device()``): the factory
    functions below make them on the CPU instead; every other name is torch's own."""

    FACTORIES = ("tensor", "zeros", "ones", "empty", "full", "arange", "zeros_like", "ones_like",
                 "empty_like", "full_like")

    def __getattr__(self, name):
        fn = getattr(torch, name)
        if name == "softmax":
            return _softmax
        if name not in self.FACTORIES:
            return fn

        def on_cpu(*args, **kwargs):
            if "device" in kwargs:
                kwargs["device"] = "cpu"
            return fn(*args, **kwargs)
        return on_cpu


class _UnevenDistributed:
    """``torch.distributed`` as tensor_parallel/mappings.py sees it: its list all-gather and
    reduce-scatter with uneven pieces (``output_split_sizes``, ``input_split_sizes``: NCCL takes
    them, gloo refuses "invalid tensor size") done as one broadcast (one reduce) per rank of the
    group, the same values; even pieces and every other name are torch.distributed's own. The
    byte counter then sees broadcasts and reduces for these two calls."""

    def __getattr__(self, name):
        return getattr(dist, name)

    @staticmethod
    def all_gather(tensor_list, tensor, group=None, async_op=False):
        if all(t.shape == tensor.shape for t in tensor_list):
            return dist.all_gather(tensor_list, tensor, group=group, async_op=async_op)
        me = dist.get_rank(group)
        for i, out in enumerate(tensor_list):       # rows of one buffer split on dim 0: contiguous
            if i == me:
                out.copy_(tensor)
            dist.broadcast(out, src=dist.get_global_rank(group, i), group=group)
        return None

    @staticmethod
    def reduce_scatter(output, input_list, op=dist.ReduceOp.SUM, group=None, async_op=False):
        if all(t.shape == output.shape for t in input_list):
            return dist.reduce_scatter(output, input_list, op=op, group=group, async_op=async_op)
        me = dist.get_rank(group)
        for i, piece in enumerate(input_list):
            buf = piece.contiguous().clone()
            dist.reduce(buf, dst=dist.get_global_rank(group, i), op=op, group=group)
            if i == me:
                output.copy_(buf)
        return None


class _MappingsTorch:
    """The ``torch`` of tensor_parallel/mappings.py: torch's own, but :class:`_UnevenDistributed`
    as its ``distributed``."""

    distributed = _UnevenDistributed()

    def __getattr__(self, name):
        return getattr(torch, name)


def _to_host(tensor, as_numpy: bool = False, record_stream: bool = False):
    """moe_utils.py ``maybe_move_tensor_to_cpu``: what the CUDA path hands back (numpy when
    ``as_numpy``), for a tensor already on the CPU."""
    if torch.is_tensor(tensor) and as_numpy:
        return tensor.numpy()
    return tensor


def _softmax(x, *args, dtype=None, **kwargs):
    """``torch.softmax(x, dim, dtype=torch.float32)`` (moe_utils.py: the router's scores): FLOAT64
    input stays float64; any other input as Megatron asks."""
    return torch.softmax(x, *args, dtype=None if x.dtype == torch.float64 else dtype, **kwargs)


# modules with device="cuda" factories on the paths a CPU run takes (megatron/core/...)
_CUDA_FACTORY_MODULES = ("optimizer.optimizer", "optimizer.clip_grads", "pipeline_parallel.schedules",
                         "transformer.utils", "transformer.moe.moe_utils", "tensor_parallel.data",
                         "distributed.param_and_grad_buffer")


def _logits_max(vocab_parallel_logits):
    """tensor_parallel/cross_entropy.py ``VocabParallelCrossEntropy.calculate_logits_max``:
    FLOAT64 logits stay float64 (Megatron: ``.float()``, i.e. fp32); others as Megatron."""
    if vocab_parallel_logits.dtype != torch.float64:
        vocab_parallel_logits = vocab_parallel_logits.float()
    return vocab_parallel_logits, torch.max(vocab_parallel_logits, dim=-1)[0]


def _grad_norm(grads_for_norm, norm_type=2, grad_stats_parallel_group=None):
    """optimizer/clip_grads.py ``get_grad_norm_fp32`` (the L2 case), its sum of squares in FLOAT64
    (Megatron: fp32 multi-tensor l2norm on device="cuda" buffers); the same two all-reduces."""
    from megatron.core.utils import get_data_parallel_group_if_dtensor, to_local_if_dtensor
    if isinstance(grads_for_norm, torch.Tensor):
        grads_for_norm = [grads_for_norm]
    dp_group = None
    for g in grads_for_norm:
        dp_group = get_data_parallel_group_if_dtensor(g, dp_group)
    if float(norm_type) != 2.0:
        raise ValueError(f"the CPU stand-in computes the L2 norm only, not norm_type {norm_type}")
    total = torch.zeros(1, dtype=torch.float64)
    for g in grads_for_norm:
        total += to_local_if_dtensor(g).double().pow(2).sum()
    if dp_group:
        dist.all_reduce(total, group=dp_group)
    dist.all_reduce(total, group=grad_stats_parallel_group)
    return math.sqrt(float(total))


def _clip(parameters, max_norm, total_norm, use_decoupled_grad=False):
    """optimizer/clip_grads.py ``clip_grad_by_total_norm_fp32`` without its 'torch.cuda.FloatTensor'
    assertion and device="cuda" buffer: the same scale, max_norm / (total_norm + 1e-6)."""
    from megatron.core.utils import to_local_if_dtensor
    coeff = max_norm / (total_norm + 1.0e-6)
    if coeff < 1.0:
        for p in ([parameters] if isinstance(parameters, torch.Tensor) else parameters):
            g = p.decoupled_grad if use_decoupled_grad else p.grad
            if g is not None:
                to_local_if_dtensor(g).detach().mul_(coeff)


_TYPE_NAMES = {torch.float16: "torch.cuda.HalfTensor", torch.bfloat16: "torch.cuda.BFloat16Tensor",
               torch.float32: "torch.cuda.FloatTensor"}


def _tensor_type(self, *args, **kwargs):
    """``Tensor.type()`` with no argument: the CUDA name Megatron's optimizers dispatch on
    (optimizer/distrib_optimizer.py, optimizer/optimizer.py: 'torch.cuda.FloatTensor' is "fp32
    params"), for a CPU tensor too; float64 answers 'torch.cuda.FloatTensor' (Megatron's fp32
    path, no master copy, which a float64 run also needs). Any other call: torch's own."""
    if args or kwargs or self.dtype not in (*_TYPE_NAMES, torch.float64):
        return _ORIGINAL_TYPE(self, *args, **kwargs)
    return _TYPE_NAMES.get(self.dtype, "torch.cuda.FloatTensor")


_ORIGINAL_TYPE = torch.Tensor.type


class _InertStream:
    """torch.cuda.Stream / Event on the CPU (moe/token_dispatcher.py's device-to-host stream):
    one stream, so every wait, record and synchronize is already satisfied (``record_event``
    hands back another inert one, which the all-to-all dispatcher synchronizes later)."""

    def __init__(self, *args, **kwargs):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def __getattr__(self, name):
        return lambda *a, **k: _InertStream()


def _replacements() -> list:
    """(object, attribute, stand-in) for every site above."""
    import importlib

    from megatron.core.optimizer import optimizer as mopt
    from megatron.core.tensor_parallel import cross_entropy, mappings, random
    from megatron.core.transformer.moe import moe_utils, token_dispatcher
    cpu_torch = _CPUTorch()
    factories = [(importlib.import_module(f"megatron.core.{m}"), "torch", cpu_torch)
                 for m in _CUDA_FACTORY_MODULES]
    return factories + [
        (random, "CudaRNGStatesTracker", CPURNGTracker),
        (random, "_CUDA_RNG_STATE_TRACKER", None),           # rebuilt as a CPURNGTracker
        (random, "_CUDA_RNG_STATE_TRACKER_INITIALIZED", False),
        (torch.cuda, "current_device", lambda: torch.device("cpu")),
        (torch.cuda, "Stream", _InertStream),
        (torch.cuda, "Event", _InertStream),
        (torch.cuda, "stream", lambda s=None: _InertStream()),
        (torch.cuda, "current_stream", lambda *a, **k: _InertStream()),
        (torch.cuda, "synchronize", lambda *a, **k: None),
        (cross_entropy.VocabParallelCrossEntropy, "calculate_logits_max", staticmethod(_logits_max)),
        (mopt, "get_grad_norm_fp32", _grad_norm),
        (mopt, "clip_grad_by_total_norm_fp32", _clip),
        (torch.Tensor, "type", _tensor_type),
        (token_dispatcher, "maybe_move_tensor_to_cpu", _to_host),
        (mappings, "torch", _MappingsTorch()),
        (moe_utils, "te_general_gemm", getattr(moe_utils, "te_general_gemm", None)),
        # models/common/language_module/language_module.py setup_embeddings_and_output_layer:
        # ``weight.data = weight.data.cuda()`` (the tied output layer of the last stage): stays
        (torch.Tensor, "cuda", lambda self, *a, **k: self),
    ]


@contextlib.contextmanager
def cpu_standins():
    """Install every stand-in for the block (inside a rank process), then restore Megatron and
    torch as they were. On a GPU rank (NCCL): nothing (Megatron as shipped); a CPU rank on a machine
    with GPUs gets them too (Megatron would otherwise make its masks and buffers on cuda:0)."""
    from ..launcher import device
    if device().type == "cuda":
        yield []
        return
    saved = []
    try:
        for obj, name, new in _replacements():
            saved.append((obj, name, obj.__dict__[name] if name in vars(obj) else getattr(obj, name, None)))
            setattr(obj, name, new)
        yield [f"{getattr(o, '__name__', o)}.{n}" for o, n, _ in saved]
    finally:
        for obj, name, old in reversed(saved):
            setattr(obj, name, old)

"""Frozen configurations with Megatron-LM's argument names, and Megatron's validity rules.

Chapter "Why parallelism" and "Planning a run". A ``ModelConfig`` says what is trained, a
``ParallelConfig`` how it is laid out on ``world_size`` GPUs, a ``PrecisionConfig`` how many bytes
each kind of tensor takes. Field names are Megatron-LM's (``--num-layers`` -> ``num_layers``), and
defaults are filled in the way ``megatron/training/arguments.py`` fills them (ffn 4h, or
int(8h/3/64)*64 with SwiGLU; kv_channels h/a; MoE ffn = ffn).

``validate(model, parallel)`` applies Megatron's rules (``rules.py``, the one rule book, in Megatron's
order); each broken rule is a ``ValueError`` that names the rule and the numbers. Pure Python: runs
in the browser too (Pyodide).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

from ..validate import positive_int
from .moe import checked_layer_freq, moe_layer_pattern
from .rules import validate, virtual_pipeline_size  # noqa: F401 - the rule book, re-exported


@dataclass(frozen=True)
class ModelConfig:
    """A GPT-style decoder (Megatron ``GPTModel``). None means "Megatron's default"."""

    num_layers: int
    hidden_size: int
    num_attention_heads: int
    seq_length: int = 2048
    vocab_size: int = 51200
    num_query_groups: int | None = None        # None = multi-head attention (no GQA)
    ffn_hidden_size: int | None = None         # None = 4h, or int(8h/3 / 64)*64 with SwiGLU
    kv_channels: int | None = None             # None = h / a
    make_vocab_size_divisible_by: int = 128
    swiglu: bool = False
    normalization: str = "LayerNorm"           # or "RMSNorm" (no bias)
    add_bias_linear: bool = True               # biases of linear layers (labkit's own count only)
    position_embedding_type: str = "learned_absolute"   # or "rope" (no position table)
    untie_embeddings_and_output_weights: bool = False
    qk_layernorm: bool = False                 # a norm over each query and key head (head_dim)
    num_experts: int | None = None             # None = dense MLPs
    moe_router_topk: int = 2
    moe_ffn_hidden_size: int | None = None     # None = ffn_hidden_size
    moe_shared_expert_intermediate_size: int | None = None
    moe_layer_freq: int | tuple = 1            # every k-th layer is MoE, or a 0/1 pattern per layer
    max_position_embeddings: int | None = None  # None = seq_length (labkit's model has no more)
    name: str = ""

    def __post_init__(self):
        for f in ("num_layers", "hidden_size", "num_attention_heads", "seq_length", "vocab_size",
                  "make_vocab_size_divisible_by", "moe_router_topk"):
            positive_int(f, getattr(self, f))
        object.__setattr__(self, "moe_layer_freq", checked_layer_freq(self.moe_layer_freq, self.num_layers))
        for f in ("num_query_groups", "ffn_hidden_size", "kv_channels", "num_experts",
                  "moe_ffn_hidden_size", "moe_shared_expert_intermediate_size", "max_position_embeddings"):
            positive_int(f, getattr(self, f), allow_none=True)
        if self.normalization not in ("LayerNorm", "RMSNorm"):
            raise ValueError(f"normalization must be LayerNorm or RMSNorm, got {self.normalization!r}")
        if self.position_embedding_type not in ("learned_absolute", "rope", "none"):
            raise ValueError(f"unknown position_embedding_type {self.position_embedding_type!r}")
        if self.kv_channels is None and self.hidden_size % self.num_attention_heads:
            raise ValueError(f"rule: hidden_size divisible by num_attention_heads when kv_channels "
                             f"is not given; {self.hidden_size} % {self.num_attention_heads} != 0")
        if self.num_query_groups is not None and self.num_attention_heads % self.num_query_groups:
            raise ValueError(f"rule: num_attention_heads divisible by num_query_groups; "
                             f"{self.num_attention_heads} % {self.num_query_groups} != 0")
        if self.num_experts is not None and self.moe_router_topk > self.num_experts:
            raise ValueError(f"rule: moe_router_topk <= num_experts; "
                             f"{self.moe_router_topk} > {self.num_experts}")
        # Megatron's defaults (arguments.py), filled in place like Megatron does.
        h = self.hidden_size
        if self.ffn_hidden_size is None:
            ffn = int((4 * h * 2 / 3) / 64) * 64 if self.swiglu else 4 * h
            object.__setattr__(self, "ffn_hidden_size", ffn)
        if self.kv_channels is None:
            object.__setattr__(self, "kv_channels", h // self.num_attention_heads)
        if self.num_experts is not None and self.moe_ffn_hidden_size is None:
            object.__setattr__(self, "moe_ffn_hidden_size", self.ffn_hidden_size)

    @property
    def query_groups(self) -> int:
        """Number of K/V heads: num_query_groups with GQA, else num_attention_heads."""
        return self.num_query_groups or self.num_attention_heads

    def padded_vocab_size(self, tp: int = 1) -> int:
        """Megatron pads the vocabulary to a multiple of make_vocab_size_divisible_by * tp."""
        multiple = self.make_vocab_size_divisible_by * tp
        return math.ceil(self.vocab_size / multiple) * multiple

    def moe_layers(self) -> list:
        """1 for each MoE layer, 0 for dense (Megatron's ``moe_layer_freq`` pattern)."""
        if self.num_experts is None:
            return [0] * self.num_layers
        return moe_layer_pattern(self.moe_layer_freq, self.num_layers)

    def with_(self, **changes) -> "ModelConfig":
        return replace(self, **changes)


@dataclass(frozen=True)
class ParallelConfig:
    """How ``world_size`` GPUs are used. ``global_batch_size`` None = micro * dp (no accumulation).

    ``zero_stage``: labkit's ZeRO stage over the DP x CP group (0 none, 1 optimizer states,
    2 + gradients, 3 + parameters). ``use_distributed_optimizer`` is Megatron's name for stage 1.
    """

    world_size: int = 1
    tensor_model_parallel_size: int = 1
    pipeline_model_parallel_size: int = 1
    num_layers_per_virtual_pipeline_stage: int | None = None
    context_parallel_size: int = 1
    expert_model_parallel_size: int = 1
    expert_tensor_parallel_size: int | None = None   # None = TP (Megatron's default)
    sequence_parallel: bool = False
    micro_batch_size: int = 1
    global_batch_size: int | None = None
    use_distributed_optimizer: bool = False
    zero_stage: int = 0
    recompute_granularity: str | None = None   # None, "selective" or "full"
    recompute_method: str | None = None        # full: "uniform" or "block"
    recompute_num_layers: int | None = None    # full: layers per unit (uniform) or per stage (block)
    recompute_modules: tuple | None = None     # selective: Megatron's default ("core_attn",)
    overlap_p2p_comm: bool = True              # Megatron's default; off, interleaving needs PP > 2
    pipeline_schedule: str | None = None       # labkit's (TrainConfig's): its placement decides what
                                               # each pp rank holds (pipeline_parallel.placement)
    # uneven pipeline splits (Megatron-LM arguments.py / TransformerConfig; pipeline.pipeline_layer_ranges)
    decoder_first_pipeline_num_layers: int | None = None
    decoder_last_pipeline_num_layers: int | None = None
    account_for_embedding_in_pipeline_split: bool = False
    account_for_loss_in_pipeline_split: bool = False

    def __post_init__(self):
        for f in ("world_size", "tensor_model_parallel_size", "pipeline_model_parallel_size",
                  "context_parallel_size", "expert_model_parallel_size", "micro_batch_size"):
            positive_int(f, getattr(self, f))
        positive_int("num_layers_per_virtual_pipeline_stage",
                 self.num_layers_per_virtual_pipeline_stage, allow_none=True)
        positive_int("global_batch_size", self.global_batch_size, allow_none=True)
        positive_int("expert_tensor_parallel_size", self.expert_tensor_parallel_size, allow_none=True)
        positive_int("decoder_first_pipeline_num_layers", self.decoder_first_pipeline_num_layers, allow_none=True)
        positive_int("decoder_last_pipeline_num_layers", self.decoder_last_pipeline_num_layers, allow_none=True)
        if self.zero_stage not in (0, 1, 2, 3):
            raise ValueError(f"zero_stage must be 0, 1, 2 or 3, got {self.zero_stage!r}")
        if self.pipeline_schedule is not None:          # fails closed: a name of placement.SCHEDULES
            from ..pipeline_parallel.placement import check_schedule
            check_schedule(self.pipeline_schedule)
        if self.recompute_granularity not in (None, "selective", "full"):
            raise ValueError(f"recompute_granularity must be None, 'selective' or 'full', "
                             f"got {self.recompute_granularity!r}")
        tp, pp, cp = (self.tensor_model_parallel_size, self.pipeline_model_parallel_size,
                      self.context_parallel_size)
        if self.world_size % (tp * pp * cp):
            raise ValueError(f"rule: world_size divisible by TP*PP*CP; {self.world_size} is not "
                             f"divisible by {tp}*{pp}*{cp} = {tp * pp * cp}")

    def check_recompute_args(self) -> None:
        """Megatron's checks of the recompute arguments (TransformerConfig.__post_init__ and
        validate_args, d98e8a64), with Megatron's messages. Called for a run (``labkit.config``);
        the calculators read "full" alone as "every layer", the estimate's shorthand."""
        g, method, n = self.recompute_granularity, self.recompute_method, self.recompute_num_layers
        if method not in (None, "uniform", "block"):
            raise ValueError(f'recompute_method: {method} must be "block" or "uniform".')
        positive_int("recompute_num_layers", n, allow_none=True)
        if g == "full":
            if method is None:
                raise ValueError('Using recompute_granularity: full so recompute_method must be "block" or "uniform"')
            if n is None:
                raise ValueError("When using recompute_granularity: full recompute_num_layers must be between "
                                 "1 and num_layers_per_pipeline_rank")
        if g == "selective":
            if method is not None:
                raise ValueError("recompute method is not yet supported for selective recomputing granularity")
            if n is not None:
                raise ValueError("When using recompute_granularity: selective recompute_num_layers must be None.")
        modules = set(self.recompute_modules or ("core_attn",))
        allowed = {"core_attn", "mlp", "layernorm", "moe_act", "mla_up_proj", "moe", "shared_experts",
                   "gdn_norm_out", "gdp_in_proj", "gdp_qkv", "mhc"}           # Megatron's choices
        if modules - allowed:
            raise ValueError(f"Invalid choices for recompute_modules: {modules - allowed}. "
                             f"Allowed modules are: {allowed}")

    # paper names (Narayanan et al. 2021): t, p, d; plus c (CP) and e (EP)
    @property
    def tp(self): return self.tensor_model_parallel_size
    @property
    def pp(self): return self.pipeline_model_parallel_size
    @property
    def cp(self): return self.context_parallel_size
    @property
    def ep(self): return self.expert_model_parallel_size
    @property
    def etp(self): return self.expert_tensor_parallel_size or self.tensor_model_parallel_size
    @property
    def edp(self): return self.world_size // (self.etp * self.ep * self.pp)  # expert-DP (RankGenerator)
    @property
    def dp(self) -> int:
        """data_parallel_size = world_size / (TP * PP * CP), as in Megatron's arguments.py."""
        return self.world_size // (self.tp * self.pp * self.cp)

    @property
    def uneven_pipeline(self) -> bool:
        """True when any of Megatron's four uneven-split arguments is set."""
        return (self.decoder_first_pipeline_num_layers is not None
                or self.decoder_last_pipeline_num_layers is not None
                or self.account_for_embedding_in_pipeline_split or self.account_for_loss_in_pipeline_split)

    @property
    def gbs(self) -> int:
        return self.global_batch_size or self.micro_batch_size * self.dp

    @property
    def optimizer_shard_stage(self) -> int:
        """Effective ZeRO stage: the distributed optimizer counts as stage 1."""
        return max(self.zero_stage, 1 if self.use_distributed_optimizer else 0)

    def with_(self, **changes) -> "ParallelConfig":
        return replace(self, **changes)


@dataclass(frozen=True)
class PrecisionConfig:
    """Bytes per element of parameters, gradients, optimizer states (per parameter) and activations.

    Mixed precision with Adam (Rajbhandari et al. 2020, Sec. 3.1): 2 (16-bit weights) + 2 (16-bit
    grads) + 12 (fp32 master weights, momentum, variance) = 16 B; Megatron keeps fp32 main
    gradients under bf16, 2 + 4 + 12 = 18 B. The labs train in fp32: 4 + 4 + 8 = 16 B.

    ``bytes_master_grad``: an fp32 copy of the gradient the optimizer steps on, held beside the
    masters (and sharded with them by the distributed optimizer). Megatron's fp16 optimizer makes
    one: ``main_param.grad = model_param.main_grad.float()`` (``megatron/core/optimizer/
    optimizer.py`` line 1097 at d98e8a64; ``distrib_optimizer.py`` line 2792 for its shard), kept
    until ``optimizer.zero_grad()`` at the start of the next step (``training.py`` line 3044), so
    ``--fp16`` holds 2 + 2 + 4 + 12 = 20 B, or 4 + 16/d with the distributed optimizer (its own
    table, ``docs/user-guide/features/dist_optimizer.md``). Counted beside the activations, as here,
    it models reserved memory (nvidia-smi): the freed per-parameter blocks stay in PyTorch's cache,
    mostly too small for the [s, b, h] activations; allocated memory peaks 4 B/param lower.
    Under bf16 the main_grad is already fp32 and ``.float()`` returns it: no copy, 18 B. labkit's
    own optimizer reads main_grad without a copy: 16 B under fp16 (:data:`LABKIT_FP16`).
    """

    bytes_param: int = 2
    bytes_grad: int = 4
    bytes_optim: int = 12
    bytes_activation: int = 2
    name: str = "bf16 + fp32 grads (Megatron)"
    bytes_master_grad: int = 0

    @property
    def bytes_per_param(self) -> int:
        return self.bytes_param + self.bytes_grad + self.bytes_optim + self.bytes_master_grad

    @property
    def sharded_bytes(self) -> int:
        """The bytes per parameter the distributed optimizer (ZeRO-1) divides by d: the fp32
        master weights and moments, and the fp32 gradient copy if there is one."""
        return self.bytes_optim + self.bytes_master_grad

    def state_bytes_per_param(self, dp: int = 1, distributed_optimizer: bool = False) -> float:
        """Model-state bytes per parameter on one rank: weight + main_grad + (optimizer [+ fp32
        gradient copy]) / d with the distributed optimizer over ``dp`` ranks, else / 1."""
        positive_int("dp", dp)
        d = dp if distributed_optimizer else 1
        return self.bytes_param + self.bytes_grad + self.sharded_bytes / d


MIXED_18 = PrecisionConfig()
MIXED_16 = PrecisionConfig(2, 2, 12, 2, "bf16 + bf16 grads (ZeRO paper)")
FP32 = PrecisionConfig(4, 4, 8, 4, "fp32 (labs)")
# --fp16 as each implementation allocates it: Megatron 20 B (4 + 16/d), labkit 16 B (4 + 12/d).
MEGATRON_FP16 = PrecisionConfig(2, 2, 12, 2, "fp16 + fp16 main grads + fp32 grad copy (Megatron --fp16)",
                                bytes_master_grad=4)
LABKIT_FP16 = PrecisionConfig(2, 2, 12, 2, "fp16 + fp16 main grads (labkit --fp16, no copy)")
PRECISIONS = {"mixed18": MIXED_18, "mixed16": MIXED_16, "fp32": FP32}


def num_microbatches(model: ModelConfig, par: ParallelConfig) -> int:
    """global_batch_size / (micro_batch_size * DP): the gradient-accumulation steps."""
    validate(model, par)
    return par.gbs // (par.micro_batch_size * par.dp)

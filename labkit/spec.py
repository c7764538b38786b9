"""The model spec: a model family is data, read by the one dense forward (labkit/model.py).

Like Megatron-LM's ``ModuleSpec`` + ``TransformerConfig`` and torchtitan's model args, a family is
a handful of choices with Megatron's argument names, not a new model class:

    normalization            "LayerNorm" | "RMSNorm"            (Megatron --normalization)
    swiglu                   fc1 = [gate; up] -> silu(gate) * up (--swiglu; else GeLU)
    position_embedding_type  "learned_absolute" | "rope" | "none"  (--position-embedding-type)
    rotary_base              RoPE's theta                         (--rotary-base)
    group_query_attention    K/V heads shared by groups of query heads (--group-query-attention)
    num_query_groups         the number of K/V heads               (--num-query-groups)
    add_bias_linear          biases in qkv, proj, fc1, fc2         (--disable-bias-linear: False)
    untie_embeddings_and_output_weights   the output layer has its own weight
    qk_layernorm             the spec's norm over each query and key head (--qk-layernorm)

GPT-2 and Llama 3 are two presets of the same :class:`GPTConfig` (:data:`PRESETS`); adding a
family built from these roles is one entry here. The modules that implement each role are in
``labkit.modules``; the parallel plans cut them by role (qkv, proj, fc1, fc2, norm, embedding,
output), never by class. Pure Python (no torch): a spec is checked before any process starts.
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace

from .calc import config as megatron_rules
from .calc.moe import MoEArgs
from .validate import positive_int

NORMALIZATIONS = ("LayerNorm", "RMSNorm")
POSITION_EMBEDDINGS = ("learned_absolute", "rope", "none")


@dataclass(frozen=True)
class ArchArgs:
    """The architecture choices of a family (Megatron's names and defaults), mixed into
    :class:`GPTConfig` (the model) and ``labkit.config.TrainConfig`` (the run). The host class has
    ``hidden_size``, ``num_attention_heads`` and ``ffn_hidden_size``."""

    normalization: str = "LayerNorm"
    swiglu: bool = False
    position_embedding_type: str = "learned_absolute"
    rotary_base: int = 10000
    group_query_attention: bool = False
    num_query_groups: int | None = None      # used only with group_query_attention, as Megatron
    add_bias_linear: bool = True
    untie_embeddings_and_output_weights: bool = False
    qk_layernorm: bool = False               # q_layernorm / k_layernorm over head_dim, before RoPE

    def _check_arch(self) -> None:
        """Choices and Megatron's rules on these arguments (ValueError naming the argument)."""
        if self.normalization not in NORMALIZATIONS:
            raise ValueError(f"normalization must be one of {NORMALIZATIONS}, got {self.normalization!r}")
        if self.position_embedding_type not in POSITION_EMBEDDINGS:
            raise ValueError(f"position_embedding_type must be one of {POSITION_EMBEDDINGS}, got "
                             f"{self.position_embedding_type!r}")
        positive_int("rotary_base", self.rotary_base)
        g = self.num_query_groups
        positive_int("num_query_groups", g, allow_none=True)
        if self.group_query_attention and g is None:
            raise ValueError("group_query_attention needs num_query_groups (the number of K/V heads)")
        if self.position_embedding_type == "rope" and (self.hidden_size // self.num_attention_heads) % 2:
            raise ValueError(f"position_embedding_type 'rope' rotates pairs of channels: the head "
                             f"dimension {self.hidden_size // self.num_attention_heads} must be even")

    @property
    def query_groups(self) -> int:
        """K/V heads: ``num_query_groups`` under group-query attention, else one per head."""
        return self.num_query_groups if self.group_query_attention else self.num_attention_heads

    def default_ffn_hidden_size(self) -> int:
        """Megatron's default (arguments.py): 4h, or int(8h/3 / 64) * 64 with SwiGLU."""
        h = self.hidden_size
        return int((4 * h * 2 / 3) / 64) * 64 if self.swiglu else 4 * h

    def arch_args(self) -> dict:
        """Every architecture argument, {name: value}."""
        return {f.name: getattr(self, f.name) for f in fields(ArchArgs)}

    def calc_arch(self) -> dict:
        """The same choices as ``labkit.calc.config.ModelConfig`` names them."""
        out = {k: v for k, v in self.arch_args().items() if k in megatron_rules.ModelConfig.__dataclass_fields__}
        out["num_query_groups"] = self.num_query_groups if self.group_query_attention else None
        return out


@dataclass(frozen=True)
class GPTConfig(ArchArgs, MoEArgs):
    """The model (``labkit.model.GPT``): dense, or MoE with ``num_experts``. ``vocab_size`` is
    already padded. Defaults: GPT-2's architecture, tiny sizes."""

    num_layers: int = 2
    hidden_size: int = 64
    num_attention_heads: int = 4
    seq_length: int = 64
    vocab_size: int = 256
    ffn_hidden_size: int | None = None  # None -> Megatron's default (4h, or SwiGLU's 8h/3 rounded)
    init_method_std: float = 0.02
    layernorm_epsilon: float = 1e-5
    hidden_dropout: float = 0.0
    attention_dropout: float = 0.0

    def __post_init__(self):
        if self.ffn_hidden_size is None:
            object.__setattr__(self, "ffn_hidden_size", self.default_ffn_hidden_size())
        self._check_moe()
        self.calc_model()    # the rule book checks sizes, hidden % heads, heads % groups, ...
        self._check_arch()
        for name in ("hidden_dropout", "attention_dropout"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"{name} must be in [0, 1), got {getattr(self, name)!r}")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    def calc_model(self):
        """This model as ``labkit.calc.config.ModelConfig`` (the calculators' view, same counts)."""
        return megatron_rules.ModelConfig(
            num_layers=self.num_layers, hidden_size=self.hidden_size, seq_length=self.seq_length,
            num_attention_heads=self.num_attention_heads, vocab_size=self.vocab_size,
            ffn_hidden_size=self.ffn_hidden_size, make_vocab_size_divisible_by=1,
            **self.calc_arch(), **self.moe_sizes())

    def num_parameters(self) -> int:
        """Every parameter of the model on one device (``labkit.calc.params``: one formula)."""
        from .calc.params import total_params
        return total_params(self.calc_model())


# A family is a preset. GPT-2 sizes: vocab 50257 padded to 50304 (a multiple of 128), as Megatron.
_LLAMA = dict(normalization="RMSNorm", swiglu=True, position_embedding_type="rope", add_bias_linear=False,
              untie_embeddings_and_output_weights=True, group_query_attention=True)
PRESETS = {
    "tiny": GPTConfig(),
    "gpt2": GPTConfig(num_layers=12, hidden_size=768, num_attention_heads=12, seq_length=1024, vocab_size=50304),
    "gpt2-medium": GPTConfig(num_layers=24, hidden_size=1024, num_attention_heads=16, seq_length=1024,
                             vocab_size=50304),
    "gpt2-large": GPTConfig(num_layers=36, hidden_size=1280, num_attention_heads=20, seq_length=1024, vocab_size=50304),
    "gpt2-xl": GPTConfig(num_layers=48, hidden_size=1600, num_attention_heads=25, seq_length=1024, vocab_size=50304),
    # Llama 3 (Dubey et al. 2024, Table 3): RMSNorm, SwiGLU, RoPE theta 500000, 8 K/V heads, untied
    "llama3-8b": GPTConfig(num_layers=32, hidden_size=4096, num_attention_heads=32, num_query_groups=8,
                           ffn_hidden_size=14336, seq_length=8192, vocab_size=128256, rotary_base=500000,
                           **_LLAMA),
    "llama3-tiny": GPTConfig(num_layers=4, hidden_size=32, num_attention_heads=8, num_query_groups=2,
                             ffn_hidden_size=64, seq_length=16, vocab_size=256, rotary_base=500000, **_LLAMA),
    # Mixtral 8x7B (Jiang et al. 2024): the Llama block with 8 SwiGLU experts, top-2, theta 1e6
    "mixtral-8x7b": GPTConfig(num_layers=32, hidden_size=4096, num_attention_heads=32, num_query_groups=8,
                              ffn_hidden_size=14336, seq_length=4096, vocab_size=32000, rotary_base=1000000,
                              num_experts=8, moe_router_topk=2, **_LLAMA),
    "mixtral-tiny": GPTConfig(num_layers=2, hidden_size=32, num_attention_heads=8, num_query_groups=2,
                              ffn_hidden_size=64, seq_length=16, vocab_size=256, rotary_base=1000000,
                              num_experts=4, moe_router_topk=2, **_LLAMA),
}
PRESETS["124m"], PRESETS["355m"] = PRESETS["gpt2"], PRESETS["gpt2-medium"]
PRESETS["774m"], PRESETS["1.5b"] = PRESETS["gpt2-large"], PRESETS["gpt2-xl"]

# The model's fields that fix a parameter's shape or meaning, the ONE list the checkpoints compare
# (labkit.checkpoint.files): the sizes, every architecture choice of ArchArgs (a new one joins by
# being declared there), the MoE shapes. rotary_base is left out: checkpoints written before it
# was listed do not hold it.
MODEL_FIELDS = (("num_layers", "hidden_size", "num_attention_heads", "ffn_hidden_size", "vocab_size", "seq_length")
                + tuple(f.name for f in fields(ArchArgs) if f.name != "rotary_base")
                + ("num_experts", "moe_ffn_hidden_size", "moe_layer_freq", "moe_shared_expert_intermediate_size"))


def field_default(name: str):
    """The default of GPTConfig's field ``name`` (what a run had before the field existed)."""
    return GPTConfig.__dataclass_fields__[name].default


# the GPTConfig fields a TrainConfig takes too (the rest, vocab_size and init, are the run's own)
_TRAIN_FIELDS = ("num_layers", "hidden_size", "num_attention_heads", "seq_length", "ffn_hidden_size",
                 "hidden_dropout", "attention_dropout")


def preset(name: str, **overrides) -> GPTConfig:
    """A named config (:data:`PRESETS`: GPT-2 sizes, "llama3-8b", "llama3-tiny", "mixtral-8x7b",
    "mixtral-tiny"), fields overridden."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose from {sorted(PRESETS)}")
    return replace(PRESETS[name], **overrides)


def preset_args(name: str, **overrides) -> dict:
    """A preset as ``labkit.train`` / ``TrainConfig`` keyword arguments (the model's fields, with
    labkit's byte vocabulary): ``labkit.train(**preset_args("llama3-tiny"), world_size=2, ...)``."""
    cfg = preset(name)
    out = {k: getattr(cfg, k) for k in _TRAIN_FIELDS}
    out.update(cfg.arch_args())
    out.update({k: v for k, v in cfg.moe_args().items() if v != MoEArgs.__dataclass_fields__[k].default})
    return {**out, **overrides}

"""Mixture of experts: Megatron's MoE arguments, the layer pattern and the capacity arithmetic.

Chapter "Expert parallelism". Pure Python (it runs in the browser too): the runtime layer
(``labkit.moe``), the configurations (``labkit.config``) and the calculators share these, so a
capacity or a layer pattern has one definition. Names and defaults are Megatron-LM's
(``megatron/core/transformer/transformer_config.py``; formulas from
``megatron/core/transformer/moe/moe_utils.py``, commit d98e8a64).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, fields


def moe_layer_pattern(moe_layer_freq, num_layers: int) -> list[int]:
    """1 for each MoE layer, 0 for a dense one: ``moe_layer_freq`` k means layers 0, k, 2k, ...
    (Megatron's ``--moe-layer-freq``), a list/tuple is the pattern itself (one 0/1 per layer)."""
    if isinstance(moe_layer_freq, (list, tuple)):
        if len(moe_layer_freq) != num_layers or set(moe_layer_freq) - {0, 1}:
            raise ValueError(f"rule: a moe_layer_freq pattern has one 0 or 1 per layer; got "
                             f"{list(moe_layer_freq)} for {num_layers} layers")
        return list(moe_layer_freq)
    if isinstance(moe_layer_freq, bool) or not isinstance(moe_layer_freq, int) or moe_layer_freq < 1:
        raise ValueError(f"moe_layer_freq must be a positive integer or a 0/1 pattern, got {moe_layer_freq!r}")
    return [int(i % moe_layer_freq == 0) for i in range(num_layers)]


def checked_layer_freq(moe_layer_freq, num_layers: int):
    """``moe_layer_freq`` validated (ValueError naming it), a pattern as a tuple (frozen configs)."""
    moe_layer_pattern(moe_layer_freq, num_layers)
    return tuple(moe_layer_freq) if isinstance(moe_layer_freq, list) else moe_layer_freq


def get_capacity(num_tokens: int, num_experts: int, capacity_factor: float) -> int:
    """Tokens one expert may take: ceil(num_tokens / num_experts * capacity_factor).

    Megatron's ``get_capacity``; the router calls it with ``num_tokens`` = the LOCAL tokens of one
    forward times top-k (``apply_router_token_dropping``), so each rank caps its own tokens.
    """
    return math.ceil((num_tokens / num_experts) * capacity_factor)


def dropped_fraction_balanced(capacity_factor: float) -> float:
    """Fraction of token copies dropped when the router spreads them evenly: 0 for a capacity
    factor >= 1 (every expert gets exactly its share), 1 - factor below 1."""
    return max(0.0, 1.0 - capacity_factor)


@dataclass(frozen=True)
class MoEArgs:
    """Megatron's mixture-of-experts arguments (``TransformerConfig`` names and defaults), mixed
    into ``labkit.config.GPTConfig`` (the model) and ``TrainConfig`` (the run). The host class has
    ``num_layers``, ``hidden_size`` and ``ffn_hidden_size``."""

    num_experts: int | None = None              # None: dense MLPs everywhere
    moe_router_topk: int = 2
    moe_ffn_hidden_size: int | None = None      # None: ffn_hidden_size
    moe_layer_freq: int | tuple = 1             # every k-th layer is MoE, or a 0/1 pattern per layer
    moe_aux_loss_coeff: float = 0.0
    moe_router_load_balancing_type: str = "aux_loss"   # or "seq_aux_loss", "none"
    moe_z_loss_coeff: float | None = None
    moe_router_pre_softmax: bool = False
    moe_expert_capacity_factor: float | None = None    # None: dropless
    moe_token_drop_policy: str = "probs"               # or "position"
    moe_pad_expert_input_to_capacity: bool = False
    moe_shared_expert_intermediate_size: int | None = None

    def moe_layers(self) -> list[int]:
        """1 for each MoE layer, 0 for a dense one (all 0 without ``num_experts``)."""
        if self.num_experts is None:
            return [0] * self.num_layers
        return moe_layer_pattern(self.moe_layer_freq, self.num_layers)

    def _check_moe(self) -> None:
        """Megatron's ``TransformerConfig.__post_init__`` checks of these options, and the router
        types labkit implements; fills ``moe_ffn_hidden_size`` as Megatron's arguments.py does."""
        object.__setattr__(self, "moe_layer_freq", checked_layer_freq(self.moe_layer_freq, self.num_layers))
        if self.num_experts is not None and self.moe_ffn_hidden_size is None:
            object.__setattr__(self, "moe_ffn_hidden_size", self.ffn_hidden_size or 4 * self.hidden_size)
        choices = {"moe_router_load_balancing_type": ("aux_loss", "seq_aux_loss", "none"),
                   "moe_token_drop_policy": ("probs", "position")}
        for name, allowed in choices.items():  # Megatron also has sinkhorn, global_aux_loss, ...
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {allowed} in labkit, got {getattr(self, name)!r}")
        if self.moe_aux_loss_coeff < 0 or (self.moe_z_loss_coeff or 0) < 0:
            raise ValueError(f"moe_aux_loss_coeff {self.moe_aux_loss_coeff} and moe_z_loss_coeff "
                             f"{self.moe_z_loss_coeff} must be >= 0")
        if self.moe_expert_capacity_factor is not None and self.moe_expert_capacity_factor <= 0:
            raise ValueError(f"moe_expert_capacity_factor must be > 0 (None: dropless), got "
                             f"{self.moe_expert_capacity_factor!r}")
        if self.moe_pad_expert_input_to_capacity and self.moe_expert_capacity_factor is None:
            raise ValueError("moe_expert_capacity_factor must be set to use "
                             "moe_pad_expert_input_to_capacity")  # Megatron's message

    def moe_sizes(self) -> dict:
        """The MoE sizes ``labkit.calc.config.ModelConfig`` takes (same names)."""
        return dict(num_experts=self.num_experts, moe_router_topk=self.moe_router_topk,
                    moe_ffn_hidden_size=self.moe_ffn_hidden_size, moe_layer_freq=self.moe_layer_freq,
                    moe_shared_expert_intermediate_size=self.moe_shared_expert_intermediate_size)

    def moe_args(self) -> dict:
        """Every MoE argument, {name: value} (a TrainConfig hands them to its GPTConfig)."""
        return {f.name: getattr(self, f.name) for f in fields(MoEArgs)}

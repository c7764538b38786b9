"""Mixture of experts: Megatron's MoE arguments, the layer pattern and the capacity arithmetic.

Chapter "Expert parallelism". Pure Python (it runs in the browser too): the runtime layer
(``labkit.moe``), the configurations (``labkit.config``) and the calculators share these, so a
capacity or a layer pattern has one definition. Names and defaults are Megatron-LM's
(``megatron/core/transformer/transformer_config.py``; formulas from
``megatron/core/transformer/moe/moe_utils.py``, commit d98e8a64).
"""
from __future__ import annotations

import ast
import math
import re
from dataclasses import dataclass, fields

from ..validate import positive_int

MAX_PATTERN_CHARS = 10_000   # a literal 0/1 list for 5,000 layers; anything longer is refused unread
MAX_PATTERN_LAYERS = 100_000  # the bound on a pattern's length when num_layers is not known


def moe_layer_pattern(moe_layer_freq, num_layers: int) -> list[int]:
    """1 for each MoE layer, 0 for a dense one: ``moe_layer_freq`` k means layers 0, k, 2k, ...
    (Megatron's ``--moe-layer-freq``), a list/tuple is the pattern itself (one 0/1 per layer)."""
    if isinstance(moe_layer_freq, (list, tuple)):
        if len(moe_layer_freq) != num_layers or set(moe_layer_freq) - {0, 1}:
            raise ValueError(f"rule: a moe_layer_freq pattern has one 0 or 1 per layer; got "
                             f"{list(moe_layer_freq)} for {num_layers} layers")
        return list(moe_layer_freq)
    positive_int("moe_layer_freq", moe_layer_freq, note=" or a 0/1 pattern")
    return [int(i % moe_layer_freq == 0) for i in range(num_layers)]


def _excerpt(text: str, n: int = 40) -> str:
    return repr(text if len(text) <= n else text[:n] + "...")


def parse_layer_freq(text: str, num_layers: int | None = None):
    """``--moe-layer-freq`` as Megatron reads it (``moe_freq_type``, arguments.py @ d98e8a64): an
    int ("2": every second layer), or a list expression of ints, lists, ``+`` and ``*`` such as
    ``[0]*3+[1]*58`` or ``([1]*3+[0])*2``, only the characters Megatron allows (digits, commas,
    brackets, parentheses, + and *: no spaces). Megatron ``eval``s the text; this walks its syntax
    tree, computes every list's LENGTH before building it and refuses one longer than
    ``num_layers`` (or MAX_PATTERN_LAYERS), so ``[1]*9**9**9`` or ``[1]*10**8`` cost nothing.
    Errors quote at most 40 characters of the text."""
    if not isinstance(text, str):
        raise ValueError(f"moe_layer_freq: expected text, got {type(text).__name__}")
    if "[" not in text:
        if not re.fullmatch(r"[0-9]{1,9}", text):
            raise ValueError(f"moe_layer_freq must be an integer or a list expression, got {_excerpt(text)}")
        return int(text)
    if len(text) > MAX_PATTERN_CHARS:
        raise ValueError(f"moe_layer_freq: a pattern of {len(text)} characters (at most "
                         f"{MAX_PATTERN_CHARS}), starting {_excerpt(text)}")
    bad = re.search(r"[^,0-9\[\]\(\)\+\*]", text)
    if bad:   # Megatron's _eval_pattern allows these characters only
        raise ValueError(f"Invalid pattern: character {bad.group()!r} at {bad.start()} of "
                         f"{_excerpt(text)} (Megatron allows digits , [ ] ( ) + * only)")
    limit = MAX_PATTERN_LAYERS if num_layers is None else num_layers
    try:
        tree = ast.parse(text, mode="eval").body
    except (SyntaxError, RecursionError, MemoryError, ValueError):
        raise ValueError(f"moe_layer_freq: not a list expression: {_excerpt(text)}") from None
    try:
        shape = _measure(tree, limit, text)
        if not isinstance(shape, list):
            raise ValueError(f"moe_layer_freq: {_excerpt(text)} is a number, not a list of 0/1 per layer")
        return _build(tree)
    except RecursionError:
        raise ValueError(f"moe_layer_freq: {_excerpt(text)} is nested too deeply") from None


def _measure(node, limit: int, text: str):
    """An int node's value, or a list node's length as [length]; refuses what eval could not do
    (or would do only by building a list longer than ``limit``)."""
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.List):
        if any(not isinstance(_measure(e, limit, text), int) for e in node.elts):
            raise ValueError(f"moe_layer_freq: list entries must be integers, in {_excerpt(text)}")
        return [len(node.elts)]
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mult)):
        a, b = _measure(node.left, limit, text), _measure(node.right, limit, text)
        if isinstance(a, int) and isinstance(b, int):
            if a > limit or b > limit:   # ints only count repetitions here: keep them small
                raise ValueError(f"moe_layer_freq: the number {max(a, b)} in {_excerpt(text)} is more "
                                 f"than the {limit} layers")
            return a + b if isinstance(node.op, ast.Add) else a * b
        if isinstance(node.op, ast.Add) and isinstance(a, list) and isinstance(b, list):
            n = a[0] + b[0]
        elif isinstance(node.op, ast.Mult) and isinstance(a, list) != isinstance(b, list):
            n = (a[0] * b) if isinstance(a, list) else (a * b[0])
        else:
            raise ValueError(f"moe_layer_freq: cannot {'add' if isinstance(node.op, ast.Add) else 'multiply'} "
                             f"a list and a number, or two lists, in {_excerpt(text)}")
        if n > limit:
            raise ValueError(f"moe_layer_freq: {_excerpt(text)} makes a list of {n} entries, more "
                             f"than num_layers {limit}")
        return [n]
    raise ValueError(f"moe_layer_freq: only integers, lists, + and * are allowed, in {_excerpt(text)}")


def _build(node):
    """The value of a tree :func:`_measure` accepted (every list already known to be short)."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.List):
        return [_build(e) for e in node.elts]
    a, b = _build(node.left), _build(node.right)
    return a + b if isinstance(node.op, ast.Add) else a * b


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

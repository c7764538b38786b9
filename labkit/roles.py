"""Roles: what a parallel plan needs to know about a module, whatever its class, in ONE table.

Every module of labkit's GPT that holds a parameter, or is a seam a plan swaps, carries a role
(``labkit.modules.role``). This table is the only place that says, per role:

    cut        how tensor parallelism cuts its parameters: "column" (output rows), "row" (input
               columns), "vocab" (vocabulary rows), "replicated", or a seam it swaps with no
               parameter of its own ("sequence": SP's scatter, "loss": vocab-parallel cross-entropy),
               "none" (nothing to cut)
    tp_sum     when the gradient of a parameter replicated over tp is summed over tp: "never" (every
               rank computed the whole gradient), "sp" (under sequence parallelism each rank saw s/t
               positions: LayerNorm/RMSNorm), "always" (each rank saw some heads: QK-layernorm)
    init       "normal" N(0, init_method_std), "scaled" N(0, std / sqrt(2 L)) (the two output
               projections of a block), "ones" (norm weights), "-" (no parameter); biases are zero
    native     the DTensor style of ``labkit.native.tp_plan`` (None: the native path cannot
               express it, and refuses a model that has one)
    recompute  Megatron's ``--recompute-modules`` name that recomputes it (selective recompute)
    plan       the plan that cuts it: "tp", "ep" (router, experts), "cp" (core attention), "" (none)

The labkit TP plan (tensor_parallel/plan.py), the native plan (native/tp_plan.py), the model's
init (model.py) and selective recompute (recompute.py) all read this table; an unknown role is an
error (:func:`get`), never "replicated": a new role is one row here, and a module without a role
that holds a parameter is refused by ``labkit.parallelize`` and the native build, named.
Pure Python (no torch).
"""
from __future__ import annotations

from dataclasses import dataclass

CUTS = ("column", "row", "vocab", "replicated", "sequence", "loss", "none")
TP_SUMS = ("never", "sp", "always")
INITS = ("normal", "scaled", "ones", "-")


@dataclass(frozen=True)
class Role:
    """One role: how it is cut, when its gradient is summed over tp, its init, its native style,
    its recompute name (see the module docstring)."""

    name: str
    cut: str
    tp_sum: str
    init: str
    native: str | None
    recompute: str | None = None
    plan: str = "tp"
    what: str = ""

    def __post_init__(self):
        for field, value, allowed in (("cut", self.cut, CUTS), ("tp_sum", self.tp_sum, TP_SUMS),
                                      ("init", self.init, INITS)):
            if value not in allowed:
                raise ValueError(f"role {self.name!r}: {field} {value!r} is not one of {allowed}")

    def summed_over_tp(self, sequence_parallel: bool) -> bool:
        """Whether this role's replicated parameters' gradients are summed over tp."""
        return self.tp_sum == "always" or (self.tp_sum == "sp" and sequence_parallel)


ROLES = {r.name: r for r in (
    Role("embedding", "vocab", "never", "normal", "embedding", what="word embeddings [V, h]"),
    Role("position", "replicated", "never", "normal", "position", what="learned position table [s, h]"),
    Role("sequence_shard", "sequence", "never", "-", "seam", what="SP: keep this rank's s/t positions"),
    Role("core_attention", "none", "never", "-", "seam", "core_attn", plan="cp",
         what="softmax(q k^T) v of the local heads"),
    Role("mlp", "none", "never", "-", "seam", "mlp", plan="", what="the dense MLP (fc1, fc2)"),
    Role("norm", "replicated", "sp", "ones", "sequence_parallel", "layernorm",
         what="LayerNorm or RMSNorm over h"),
    Role("qk_norm", "replicated", "always", "ones", "heads",
         what="LayerNorm or RMSNorm over a head's d, applied to every query or key head (--qk-layernorm)"),
    Role("qkv", "column", "never", "normal", "colwise", what="fused Q/K/V, per query group [q.. | k | v]"),
    Role("proj", "row", "never", "scaled", "rowwise", what="attention output projection"),
    Role("fc1", "column", "never", "normal", "colwise", what="first MLP linear ([gate; up] with SwiGLU)"),
    Role("fc2", "row", "never", "scaled", "rowwise", what="second MLP linear"),
    Role("output", "column", "never", "normal", "output", what="output layer (logits), vocabulary rows"),
    Role("loss", "loss", "never", "-", "seam", what="cross-entropy (vocab-parallel under TP)"),
    Role("moe", "none", "never", "-", None, plan="ep", what="a mixture-of-experts layer"),
    Role("router", "replicated", "sp", "normal", None, plan="ep", what="the MoE router [E, h]"),
    Role("expert", "none", "never", "-", None, plan="ep", what="one routed expert (an MLP)"),
    Role("expert_fc1", "column", "never", "normal", None, plan="ep", what="an expert's fc1, cut over etp"),
    Role("expert_fc2", "row", "never", "scaled", None, plan="ep", what="an expert's fc2, cut over etp"),
)}

# Megatron's --recompute-modules names labkit implements, from the table (in its order)
RECOMPUTE_MODULES = tuple(dict.fromkeys(r.recompute for r in ROLES.values() if r.recompute))


def get(name: str | None, where: str = "") -> Role:
    """The role called ``name``; ValueError naming ``where`` (the module) when it has none or an
    unknown one: roles fail closed."""
    if name is None:
        raise ValueError(f"module {where!r} has no role: tag it with labkit.modules.role(module, name), "
                         f"a role of labkit.roles.ROLES ({', '.join(ROLES)})")
    if name not in ROLES:
        raise ValueError(f"module {where!r} has role {name!r}, which labkit.roles.ROLES does not list "
                         f"({', '.join(ROLES)}): add a row for it")
    return ROLES[name]


def by_recompute(names) -> set[str]:
    """The roles selective recompute of Megatron's ``names`` (``recompute_modules``) recomputes."""
    unknown = set(names) - set(RECOMPUTE_MODULES)
    if unknown:
        raise ValueError(f"recompute_modules {sorted(unknown)}: labkit recomputes {list(RECOMPUTE_MODULES)}")
    return {r.name for r in ROLES.values() if r.recompute in set(names)}


def of_parameters(model) -> dict:
    """{parameter name: the Role of the module that holds it} for ``model`` (any ``nn.Module``, in
    ``named_parameters`` order). ValueError naming the module for a parameter whose module has no
    role, or a module with an unknown role."""
    out = {}
    for name, module in model.named_modules():
        params = [k for k, _ in module.named_parameters(recurse=False)]
        tagged = getattr(module, "role", None)
        if not params and tagged is None:
            continue
        r = get(tagged, name)
        prefix = name + "." if name else ""
        out.update({prefix + k: r for k in params})
    return out

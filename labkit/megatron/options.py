"""What ``implementation="megatron"`` runs, and what it refuses (each refusal a named rule with its
reason), for a TrainConfig. Pure Python: checked before any process starts, as
``labkit.config.check`` is for labkit's own implementation and ``labkit.native.options`` for
PyTorch's.

    refusals(cfg, world_size)   -> [(rule, reason)]  (empty: Megatron-Core runs it here)
    check_megatron(cfg, world)  -> Topology, or ValueError "... [rule] reason; [rule] reason"

A fuzzer treats the ValueError as "refused by a named rule" (the names in :data:`RULES`).
"""
from __future__ import annotations

import importlib.util

MEGATRON_CORE_VERSION = "0.16.1"     # requirements-megatron.txt pins it

# context parallelism with the local spec, quoted from megatron/core/transformer/dot_product_attention.py
CP_ERROR = "Context parallelism is only supported by TEDotProductAttention!"

RULES = {
    "cp": f"context_parallel_size > 1: Megatron-Core's local attention (DotProductAttention) asserts "
          f"{CP_ERROR!r}; Transformer Engine needs CUDA",
    "zero": "zero_stage 2 or 3: Megatron-Core's DistributedDataParallel has no ZeRO-2/3 (its "
            "distributed optimizer is ZeRO-1: use_distributed_optimizer=True; full sharding is "
            "Megatron-FSDP, not wired here)",
    "precision": "bf16 / fp16: labkit.megatron runs Megatron-Core in params_dtype float32 or "
                 "float64 (its Float16Module and grad scaler are not wired here)",
    "dtype": "params_dtype must be float32 or float64",
    "recompute": "activation recomputation: not mapped onto Megatron's recompute_* arguments here",
    "schedule": "pipeline_schedule: Megatron-Core chooses its own (1F1B, or interleaved 1F1B with "
                "num_layers_per_virtual_pipeline_stage)",
    "dropout": "dropout: Megatron draws its masks from its own RNG tracker streams, not labkit's, "
               "so the one-device oracle cannot judge the run; set hidden_dropout and "
               "attention_dropout to 0",
    "gqa_tp": "num_query_groups neither a multiple nor a divisor of tensor_model_parallel_size: "
              "Megatron-Core's TransformerConfig refuses it (with g < t it all-gathers the fused "
              "QKV output and keeps its group's slice: transformer/attention.py)",
    "moe_bias": "num_experts with add_bias_linear, expert_model_parallel_size 1 and expert tensor "
                "parallel size 1: Megatron-Core 0.16.1's MLP adds the expert's fc2 bias in place "
                "to a view autograd refuses to modify (a Megatron-Core bug; tests/test_megatron.py "
                "keeps its reproducer); set add_bias_linear=False",
    "moe_router_bias": "num_experts with add_bias_linear: Megatron-Core 0.16.1's router gets a bias of "
                       "its own (moe/router.py: 'if self.config.add_bias_linear'), labkit's router has "
                       "none (logits = x W_r^T, as in Switch and GShard): two different models, which "
                       "no oracle can compare; set add_bias_linear=False (found by labkit fuzz "
                       "--implementation megatron, seed 2026: a KeyError for the router's bias)",
    "moe_bias_etp": "num_experts with add_bias_linear and an expert tensor-parallel size above 1: "
                    "Megatron-Core's TransformerConfig asserts 'Bias in Moe is only supported when "
                    "ETP==1' (the expert tensor-parallel size defaults to tensor_model_parallel_size); "
                    "set add_bias_linear=False or expert_tensor_parallel_size=1 (found by labkit fuzz "
                    "--implementation megatron)",
    "moe_etp_ep1": "num_experts with expert_model_parallel_size 1 and an expert tensor-parallel size "
                   "other than tensor_model_parallel_size: Megatron-Core 0.16.1 marks the experts "
                   "dense (tensor_parallel/layers.py, moe/experts.py: allreduce = not "
                   "expert_parallel), so their gradients are summed over data parallelism only, not "
                   "over the TP ranks that routed other tokens to them: silently wrong expert "
                   "gradients (labkit fuzz --implementation megatron; fixed on Megatron-LM main by "
                   "use_expert_pgs; tests/test_megatron.py keeps the reproducer)",
    "moe_shared_bias": "moe_shared_expert_intermediate_size with add_bias_linear: Megatron-Core's "
                       "SharedExpertMLP asserts 'bias is not supported in the shared experts' "
                       "(moe/shared_experts.py); set add_bias_linear=False (found by labkit fuzz "
                       "--implementation megatron)",
    "moe_drop": "moe_token_drop_policy 'position': labkit keeps the first tokens in [s, b] order, "
                "Megatron takes top-k of the 0/1 routing map (its tie order is the kernel's): the "
                "two drop different tokens by design; use 'probs'",
    "moe_topk1": "moe_router_topk 1 without moe_router_pre_softmax: Megatron-Core's TransformerConfig "
                 "refuses it ('Please use --moe-router-pre-softmax when topk is 1': a softmax over "
                 "the one chosen score is 1, so the loss would give the router no gradient); set "
                 "moe_router_pre_softmax=True (found by labkit fuzz --implementation megatron)",
    "distopt_dtype": "use_distributed_optimizer with float64: Megatron's distributed optimizer "
                     "copies each shard's gradient to its main parameter with .float() "
                     "(optimizer/distrib_optimizer.py _copy_model_grads_to_main_grads), which torch "
                     "refuses for a float64 parameter; use params_dtype float32",
}


def installed() -> bool:
    """Is ``megatron.core`` importable here (``pip install -r requirements-megatron.txt``)?"""
    try:
        return importlib.util.find_spec("megatron.core") is not None
    except ModuleNotFoundError:
        return False


def refusals(cfg, world_size: int) -> list[tuple[str, str]]:
    """[(rule, reason)] for everything of ``cfg`` this path cannot run (after labkit's own rules,
    which raise first: ``cfg.validate``)."""
    topo = cfg.validate(world_size)
    rules = []
    if topo.cp > 1:
        rules.append("cp")
    if cfg.zero_stage in (2, 3):
        rules.append("zero")
    if cfg.bf16 or cfg.fp16:
        rules.append("precision")
    if cfg.params_dtype not in ("float32", "float64"):
        rules.append("dtype")
    if cfg.recompute_granularity is not None:
        rules.append("recompute")
    if cfg.pipeline_schedule is not None:
        rules.append("schedule")
    if cfg.hidden_dropout or cfg.attention_dropout:
        rules.append("dropout")
    if topo.tp > 1 and cfg.query_groups % topo.tp and topo.tp % cfg.query_groups:
        rules.append("gqa_tp")
    if cfg.num_experts is not None and cfg.add_bias_linear and topo.ep == 1 and topo.etp == 1:
        rules.append("moe_bias")
    if cfg.num_experts is not None and cfg.add_bias_linear:                  # moe/router.py
        rules.append("moe_router_bias")
    if cfg.num_experts is not None and cfg.add_bias_linear and topo.etp > 1:   # transformer_config.py
        rules.append("moe_bias_etp")
    if cfg.num_experts is not None and cfg.moe_shared_expert_intermediate_size and cfg.add_bias_linear:
        rules.append("moe_shared_bias")
    if cfg.num_experts is not None and topo.ep == 1 and topo.etp != topo.tp:   # an upstream bug
        rules.append("moe_etp_ep1")
    if cfg.num_experts is not None and cfg.moe_expert_capacity_factor is not None \
            and cfg.moe_token_drop_policy == "position":
        rules.append("moe_drop")
    if cfg.num_experts is not None and cfg.moe_router_topk == 1 and not cfg.moe_router_pre_softmax \
            and cfg.moe_router_load_balancing_type != "sinkhorn":   # transformer_config.py's condition
        rules.append("moe_topk1")
    if cfg.use_distributed_optimizer and cfg.params_dtype == "float64":
        rules.append("distopt_dtype")
    return [(r, RULES[r]) for r in rules]


def check_megatron(cfg, world_size: int):
    """The Topology, or a ValueError naming every rule ``cfg`` breaks here."""
    found = refusals(cfg, world_size)
    if found:
        raise ValueError("implementation 'megatron' cannot run this layout: "
                         + "; ".join(f"[{rule}] {why}" for rule, why in found))
    return cfg.topology(world_size)


def require_installed() -> None:
    """An ImportError with the install line when megatron-core is absent."""
    if not installed():
        raise ImportError(f"implementation 'megatron' needs megatron-core {MEGATRON_CORE_VERSION}: "
                          f"pip install -r requirements-megatron.txt")

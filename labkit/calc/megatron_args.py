"""Megatron-LM's arguments for ``megatron_estimate``: real names only, Megatron's defaults, derived
values as ``validate_args`` derives them, and the layout checked by the one rule book.

Follows NVIDIA/Megatron-LM at commit d98e8a64 (2026-08-22): ``parse_args`` and ``validate_args`` in
``megatron/training/arguments.py``, the tokenizer's vocabulary padding
(``megatron/core/tokenizers/utils/build_tokenizer.py``), ``initialize_model_parallel``
(``megatron/core/parallel_state.py``). The flag list itself is data (``megatron_flags.py``).

Three kinds of refusal, each naming what is wrong:

- a name that is not a Megatron argument (with the closest real one), or a wrong value type;
- Megatron's argument checks that are not about the layout (``validate_args`` asserts: deprecated
  arguments, required ones, MLA without GQA, MTP only with RoPE, ...);
- the layout rules (heads divisible by TP, layers by PP, the global-batch rule, ...): these are
  ``labkit.calc.config.validate``'s, called here and nowhere duplicated.

Arguments the estimate does not read are accepted and ignored, as a pasted command line needs.
"""
from __future__ import annotations

import difflib
import math
from types import SimpleNamespace

from ..validate import int_at_least
from .config import ModelConfig, ParallelConfig, validate
from .megatron_flags import CHOICES, ESTIMATE_DEFAULTS, LISTS, SWITCHES, VALUES


def _flag_table() -> dict:
    """'tensor-model-parallel-size' -> (dest, kind, value stored by a switch)."""
    table = {}
    for kind, text in (("switch", SWITCHES), ("value", VALUES), ("list", LISTS)):
        for entry in text.split():
            flag, _, dest = entry.partition("=")
            stored = not dest.startswith("!")
            table[flag] = (dest.lstrip("!") or flag.replace("-", "_"), kind, stored)
    return table


FLAGS = _flag_table()
DESTS = {dest for dest, _, _ in FLAGS.values()}

# validate_args refuses these outright (arguments.py, "Deprecated arguments")
DEPRECATED = {
    "batch_size": "--batch-size argument is no longer valid, use --micro-batch-size instead",
    "warmup": "--warmup argument is no longer valid, use --lr-warmup-fraction instead",
    "model_parallel_size": "--model-parallel-size is no longer valid, use "
                           "--tensor-model-parallel-size instead",
    "checkpoint_activations": "--checkpoint-activations is no longer valid, use "
                              "--recompute-activations, or, for more control, "
                              "--recompute-granularity and --recompute-method.",
}
# real arguments that change the estimate's formulas or the layout rules in ways this estimate and
# labkit.calc.config.validate do not model: refused rather than answered wrongly
NOT_COVERED = {
    "hybrid_layer_pattern": "hybrid Mamba/attention models (Megatron prints no estimate for them)",
    "hybrid_override_pattern": "hybrid Mamba/attention models (Megatron prints no estimate for them)",
    "experimental_attention_variant": "linear-attention layers (gated delta net) in the FLOPs count",
    "pipeline_model_parallel_layout": "an explicit pipeline layout",
    "microbatch_group_size_per_vp_stage": "a microbatch group size other than PP (interleaving)",
    "tensor_parallel_num_weight_shards": "generalized TP weight shards (GTP remat)",
    "expert_tensor_parallel_num_weight_shards": "generalized TP weight shards (GTP remat)",
    "rampup_batch_size": "a batch-size ramp-up (microbatches change during the run)",
    "step_batch_size_schedule": "a batch-size schedule (microbatches change during the run)",
}


def closest(name: str, cli: bool = False) -> str | None:
    """The real Megatron argument nearest to a misspelt one (flag form if ``cli``)."""
    if cli:
        hit = difflib.get_close_matches(name.lstrip("-"), list(FLAGS), n=1, cutoff=0.6)
        return "--" + hit[0] if hit else None
    hit = difflib.get_close_matches(name, sorted(DESTS), n=1, cutoff=0.6)
    return hit[0] if hit else None


def unknown_message(name: str, cli: bool = False) -> str:
    if name.lstrip("-").replace("-", "_") == "virtual_pipeline_model_parallel_size":
        return (f"{name} is not a Megatron-LM flag: validate_args derives it; give "
                f"--num-virtual-stages-per-pipeline-rank or --num-layers-per-virtual-pipeline-stage")
    near = closest(name, cli)
    hint = f"; did you mean {near}?" if near else ""
    return f"{name} is not a Megatron-LM argument (megatron/training/arguments.py @ d98e8a64){hint}"


def _check_names(kwargs: dict) -> None:
    if kwargs.get("step_batch_size_schedule") is not None and kwargs.get("global_batch_size"):
        raise ValueError("Cannot specify both --step-batch-size-schedule and --global-batch-size")
    for name, value in kwargs.items():
        if name not in DESTS:
            raise ValueError(unknown_message(name))
        if name in DEPRECATED and value not in (None, False):
            raise ValueError(DEPRECATED[name])
        if name in NOT_COVERED and not _harmless(name, value, kwargs):
            raise ValueError(f"{name}={value!r}: not covered by labkit's Megatron estimate "
                             f"({NOT_COVERED[name]})")
        if name in CHOICES and value is not None and value not in CHOICES[name]:
            raise ValueError(f"{name} must be one of {CHOICES[name]}, got {value!r}")


def _harmless(name: str, value, kw: dict) -> bool:
    """A NOT_COVERED argument at its default (or a value that means the same) is fine."""
    if name == "experimental_attention_variant":
        return value in (None, "dsa")  # DSA keeps standard attention's FLOPs formula
    interleaved = (kw.get("num_layers_per_virtual_pipeline_stage") is not None
                   or kw.get("num_virtual_stages_per_pipeline_rank") is not None)
    if name == "microbatch_group_size_per_vp_stage":
        return not interleaved or value in (None, kw.get("pipeline_model_parallel_size", 1))
    if name == "tensor_parallel_num_weight_shards":
        return value in (None, kw.get("tensor_model_parallel_size", 1))
    if name == "expert_tensor_parallel_num_weight_shards":
        return value in (None, kw.get("expert_tensor_parallel_size")
                         or kw.get("tensor_model_parallel_size", 1))
    return value is None or value is False


# integer arguments the rule book's dataclasses do not check themselves
_POSITIVE = ("expert_tensor_parallel_size", "vocab_size", "padded_vocab_size", "q_lora_rank",
             "kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim", "mtp_num_layers",
             "num_virtual_stages_per_pipeline_rank", "seq_length", "micro_batch_size")


def megatron_args(world_size: int, **kwargs) -> SimpleNamespace:
    """Megatron's ``args`` for a launch on ``world_size`` GPUs: defaults filled and values derived
    in ``validate_args``'s order; raise ValueError naming the argument or the rule."""
    if "virtual_pipeline_model_parallel_size" in kwargs:  # Megatron's derived name, as an input
        kwargs = dict(kwargs)
        vpp = kwargs.pop("virtual_pipeline_model_parallel_size")
        if vpp is not None and kwargs.setdefault("num_virtual_stages_per_pipeline_rank", vpp) != vpp:
            raise ValueError("virtual_pipeline_model_parallel_size and "
                             "num_virtual_stages_per_pipeline_rank differ")
    _check_names(kwargs)
    a = SimpleNamespace(**{**ESTIMATE_DEFAULTS, **{k: v for k, v in kwargs.items()
                                                    if k in ESTIMATE_DEFAULTS}})
    a.world_size, a.notes = world_size, []
    tp, pp, cp = a.tensor_model_parallel_size, a.pipeline_model_parallel_size, a.context_parallel_size
    ParallelConfig(world_size=world_size, tensor_model_parallel_size=tp,  # the world-size rule first,
                   pipeline_model_parallel_size=pp, context_parallel_size=cp)  # as validate_args
    if a.num_layers is None:
        a.num_layers = a.encoder_num_layers
    if a.seq_length is None:
        a.seq_length = a.encoder_seq_length
    missing = [k for k in ("num_layers", "hidden_size", "num_attention_heads", "seq_length",
                           "micro_batch_size") if getattr(a, k) is None]
    if missing:
        raise ValueError(f"missing required Megatron arguments: {missing}")
    for name in _POSITIVE:
        value = getattr(a, name)
        int_at_least(name, value, 0 if name == "mtp_num_layers" else 1, allow_none=True)
    if a.padded_vocab_size is None and a.vocab_size is None:
        raise ValueError("give vocab_size (the tokenizer's) or padded_vocab_size")
    a.data_parallel_size = world_size // (tp * pp * cp)
    if a.expert_tensor_parallel_size is None:
        a.expert_tensor_parallel_size = tp
    if a.recompute_activations:
        a.recompute_granularity = "selective"
    if a.global_batch_size is None:
        a.global_batch_size = a.micro_batch_size * a.data_parallel_size
    _virtual_pipeline(a)
    if tp == 1 and a.sequence_parallel:
        a.sequence_parallel = False
        a.notes.append("sequence_parallel turned off: TP is 1 (as validate_args does)")
    if a.max_position_embeddings is None:
        a.max_position_embeddings = a.seq_length
        a.notes.append("max_position_embeddings not given (Megatron requires it): seq_length used")
    if a.num_experts == 0:
        a.num_experts = None
    _argument_asserts(a)
    if not a.group_query_attention and "num_query_groups" in kwargs:
        a.notes.append("num_query_groups is ignored without group_query_attention (as in Megatron)")
    if a.use_megatron_fsdp and a.megatron_fsdp_version == 1:
        a.use_distributed_optimizer = True  # validate_args: Megatron-FSDP v1 needs it
    if a.padded_vocab_size is None:
        multiple = a.make_vocab_size_divisible_by * tp
        a.padded_vocab_size = (math.ceil(a.vocab_size / multiple) * multiple if a.pad_vocab_size
                               else a.vocab_size)
    model, par = _rule_book(a)
    a.ffn_hidden_size, a.kv_channels = model.ffn_hidden_size, model.kv_channels
    a.moe_ffn_hidden_size = model.moe_ffn_hidden_size if a.num_experts else a.moe_ffn_hidden_size
    a.num_microbatches = a.global_batch_size // (a.micro_batch_size * a.data_parallel_size)
    return a


def _virtual_pipeline(a) -> None:
    """virtual_pipeline_model_parallel_size as validate_args derives it (1 means not interleaved)."""
    vl, vs = a.num_layers_per_virtual_pipeline_stage, a.num_virtual_stages_per_pipeline_rank
    if vl is not None and vs is not None:
        raise ValueError("No more than one of the following arguments can be set at the same time: "
                         "--num-layers-per-virtual-pipeline-stage, "
                         "--num-virtual-stages-per-pipeline-rank")
    pp, vpp = a.pipeline_model_parallel_size, None
    layers = a.num_layers + a.account_for_embedding_in_pipeline_split + a.account_for_loss_in_pipeline_split
    if vl is not None and layers % pp == 0 and (layers // pp) % vl == 0:
        vpp = (layers // pp) // vl
    elif vs is not None:
        vpp = vs
        if a.decoder_first_pipeline_num_layers or a.decoder_last_pipeline_num_layers:
            raise ValueError("num_virtual_stages_per_pipeline_rank with decoder_first/last_pipeline_"
                             "num_layers: not covered by labkit's rule book (labkit.calc.config)")
        if layers % pp == 0 and (layers // pp) % vs == 0:
            a.num_layers_per_virtual_pipeline_stage = (layers // pp) // vs  # for the rule book
        elif layers % pp == 0:  # transformer_block.get_num_layers_to_build asserts this
            raise ValueError(f"rule: layers per pipeline stage divisible by "
                             f"num_virtual_stages_per_pipeline_rank; {layers // pp} % {vs} != 0")
    a.virtual_pipeline_model_parallel_size = None if vpp == 1 else vpp


def _argument_asserts(a) -> None:
    """validate_args' checks of argument combinations (not of the layout)."""
    if a.multi_latent_attention and a.group_query_attention:
        raise ValueError("Group query attention is mutually exclusive with multi latent attention.")
    if a.mtp_num_layers and a.position_embedding_type not in ("rope", "none"):
        raise ValueError(f"Multi-Token Prediction (MTP) is not supported with "
                         f"{a.position_embedding_type} position embedding type. The supported "
                         f"position embedding types are rope and none.")
    if a.moe_latent_size is not None:
        if a.moe_latent_size <= 0:
            raise ValueError("MoE latent projection dimension has to be greater than zero.")
        if a.num_experts is None:
            raise ValueError("MoE latent projections are applicable only for MoE models.")
    if a.use_megatron_fsdp and a.megatron_fsdp_version == 2 and a.use_distributed_optimizer:
        raise ValueError("--megatron-fsdp-version 2 is not compatible with --use-distributed-optimizer")
    if isinstance(a.moe_layer_freq, list) and len(a.moe_layer_freq) != a.num_layers:
        raise ValueError(f"Invalid length of moe_layer_pattern: {len(a.moe_layer_freq)}, "
                         f"expected {a.num_layers}, current moe layer pattern: {a.moe_layer_freq}")


_UNEVEN = ("decoder_first_pipeline_num_layers", "decoder_last_pipeline_num_layers",
           "account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split")


def _rule_book(a):
    """The layout as labkit.calc.config sees it, validated there (the one rule book)."""
    model = ModelConfig(
        num_layers=a.num_layers, hidden_size=a.hidden_size, num_attention_heads=a.num_attention_heads,
        seq_length=a.seq_length, vocab_size=a.padded_vocab_size, ffn_hidden_size=a.ffn_hidden_size,
        kv_channels=a.kv_channels, swiglu=a.swiglu, normalization=a.normalization,
        num_query_groups=a.num_query_groups if a.group_query_attention else None,
        untie_embeddings_and_output_weights=a.untie_embeddings_and_output_weights,
        num_experts=a.num_experts, moe_router_topk=a.moe_router_topk,
        moe_ffn_hidden_size=a.moe_ffn_hidden_size,
        moe_shared_expert_intermediate_size=a.moe_shared_expert_intermediate_size,
        max_position_embeddings=a.max_position_embeddings,
        moe_layer_freq=a.moe_layer_freq if isinstance(a.moe_layer_freq, int) else tuple(a.moe_layer_freq))
    par = ParallelConfig(
        world_size=a.world_size, tensor_model_parallel_size=a.tensor_model_parallel_size,
        pipeline_model_parallel_size=a.pipeline_model_parallel_size,
        context_parallel_size=a.context_parallel_size,
        expert_model_parallel_size=a.expert_model_parallel_size,
        expert_tensor_parallel_size=a.expert_tensor_parallel_size,
        num_layers_per_virtual_pipeline_stage=a.num_layers_per_virtual_pipeline_stage,
        sequence_parallel=a.sequence_parallel, micro_batch_size=a.micro_batch_size,
        global_batch_size=a.global_batch_size, use_distributed_optimizer=a.use_distributed_optimizer,
        recompute_granularity=a.recompute_granularity, overlap_p2p_comm=a.overlap_p2p_comm,
        **{k: getattr(a, k) for k in _UNEVEN})
    validate(model, par)
    return model, par


# The Llama family's arguments, as labkit.megatron_bridge.to_flags writes them for labkit's presets,
# run through Megatron's own parse_args + validate_args at COMMIT (CPU, no Megatron in CI; re-run
# 2026-11-25 when to_flags began writing --lr-decay-style constant:
# tests/fixtures/megatron_validate_args.py says how) and accepted: {world size: flags}.
# tests/test_llama.py checks that to_flags still writes exactly these and that every one is in
# Megatron's flag table; the names are Megatron's: --normalization, --swiglu,
# --position-embedding-type, --rotary-base, --group-query-attention, --num-query-groups,
# --disable-bias-linear (stores add_bias_linear=False), --untie-embeddings-and-output-weights.
CHECKED = {
    "llama3-tiny tp2 sp": (4, "--normalization RMSNorm --swiglu --position-embedding-type rope --rotary-base 500000 "
                              "--group-query-attention --num-query-groups 2 --disable-bias-linear "
                              "--untie-embeddings-and-output-weights --num-layers 4 --hidden-size 32 "
                              "--num-attention-heads 8 --seq-length 16 --ffn-hidden-size 64 --global-batch-size 8 "
                              "--tensor-model-parallel-size 2 --sequence-parallel --micro-batch-size 2 --lr 0.001 "
                              "--clip-grad 0.0 --hidden-dropout 0.0 --attention-dropout 0.0 "
                              "--max-position-embeddings 16 --lr-decay-style constant --train-iters 10"),
    "llama3-tiny tp4 sp": (8, "--normalization RMSNorm --swiglu --position-embedding-type rope --rotary-base 500000 "
                              "--group-query-attention --num-query-groups 2 --disable-bias-linear "
                              "--untie-embeddings-and-output-weights --num-layers 4 --hidden-size 32 "
                              "--num-attention-heads 8 --seq-length 16 --ffn-hidden-size 64 --global-batch-size 8 "
                              "--tensor-model-parallel-size 4 --sequence-parallel --micro-batch-size 2 --lr 0.001 "
                              "--clip-grad 0.0 --hidden-dropout 0.0 --attention-dropout 0.0 "
                              "--max-position-embeddings 16 --lr-decay-style constant --train-iters 10"),
    "mixtral-tiny tp2 sp pp2 ep2": (8, "--num-experts 4 --moe-ffn-hidden-size 64 --normalization RMSNorm --swiglu "
                                       "--position-embedding-type rope --rotary-base 1000000 --group-query-attention "
                                       "--num-query-groups 2 --disable-bias-linear --untie-embeddings-and-output-weights "
                                       "--hidden-size 32 --num-attention-heads 8 --seq-length 16 --ffn-hidden-size 64 "
                                       "--global-batch-size 8 --tensor-model-parallel-size 2 --sequence-parallel "
                                       "--pipeline-model-parallel-size 2 --expert-model-parallel-size 2 --num-layers 2 "
                                       "--micro-batch-size 2 --lr 0.001 --clip-grad 0.0 --hidden-dropout 0.0 "
                                       "--attention-dropout 0.0 --max-position-embeddings 16 --lr-decay-style constant "
                                       "--train-iters 10"),
}
CHECKED_LAYOUTS = {   # the TrainConfig overrides of each (with micro batch 2, global batch 8)
    "llama3-tiny tp2 sp": ("llama3-tiny", dict(tensor_model_parallel_size=2, sequence_parallel=True)),
    "llama3-tiny tp4 sp": ("llama3-tiny", dict(tensor_model_parallel_size=4, sequence_parallel=True)),
    "mixtral-tiny tp2 sp pp2 ep2": ("mixtral-tiny", dict(expert_model_parallel_size=2, tensor_model_parallel_size=2,
                                                         sequence_parallel=True, pipeline_model_parallel_size=2)),
}

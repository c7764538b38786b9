"""A TrainConfig built with Megatron-Core's own classes, on one rank of a launch: its
``parallel_state`` (from labkit's Topology sizes), a ``TransformerConfig``, ``GPTModel`` chunks with
the local (non-Transformer-Engine) layer spec, wrapped in Megatron's ``DistributedDataParallel``,
and Megatron's optimizer. The weights are labkit's dense model's, cut by ``weights.load``.

    TrainConfig (Megatron's argument names)      Megatron-Core
    tensor_model_parallel_size, sequence_...     TransformerConfig + parallel_state
    pipeline_model_parallel_size (+ v)           one GPTModel per virtual stage (vp_stage)
    normalization, swiglu, rope, GQA, biases     get_gpt_layer_local_spec + TransformerConfig
    untie_embeddings_and_output_weights          share_embeddings_and_output_weights
    use_distributed_optimizer                    DistributedDataParallelConfig + DistributedOptimizer
    num_experts, moe_* (router, aux/z loss,      num_moe_experts, moe_* (the same names), the local
      capacity, shared expert, dispatcher),        spec's MoELayer (SequentialMLP experts) on the
      expert_model/tensor_parallel_size            layers moe_layer_freq names, dense MLP elsewhere
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


class SPTorchNorm:
    """transformer/torch_norm.py ``WrappedTorchNorm`` (torch's LayerNorm / RMSNorm) without its
    assertion "sequence parallel not supported by torch LayerNorm": under SP each TP rank normalizes
    its s/t positions, so the weight's (and bias's) gradient is a partial sum over TP ranks.
    Apex's FusedLayerNorm (fusions/fused_layer_norm.py) tags its parameters
    ``sequence_parallel`` so that ``finalize_model_grads`` all-reduces them over TP; this does the
    same. Not a patch: the layer spec names this class in place of WrappedTorchNorm."""

    def __new__(cls, config, hidden_size: int, eps: float = 1e-5, **kwargs):
        norm_cls = torch.nn.RMSNorm if config.normalization == "RMSNorm" else torch.nn.LayerNorm
        norm = norm_cls(hidden_size, eps=eps, dtype=config.params_dtype)
        for p in norm.parameters():
            p.sequence_parallel = config.sequence_parallel and SPTorchNorm.tag
        return norm

    tag = True      # the negative control (tests) sets False: Megatron's untagged torch norm


def init_parallel_state(cfg, topo) -> None:
    """Megatron's process groups (``initialize_model_parallel``, order tp-cp-ep-dp-pp) of the sizes
    of labkit's Topology, and its model-parallel RNG streams (on the CPU: cpu_standins)."""
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed
    v = cfg.virtual_pipeline_size()
    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=topo.tp, pipeline_model_parallel_size=topo.pp,
        virtual_pipeline_model_parallel_size=v if v > 1 else None,
        context_parallel_size=topo.cp, expert_model_parallel_size=topo.ep,
        expert_tensor_parallel_size=cfg.expert_tensor_parallel_size)
    model_parallel_cuda_manual_seed(1234)


def transformer_config(cfg, dtype, batch_p2p: bool = False):
    """TrainConfig -> megatron.core TransformerConfig (every fused kernel off: the local spec).
    ``batch_p2p``: interleaved pipelines batch their p2p too (Megatron-Core's TransformerConfig
    default; the tests' reproducer of the swap)."""
    from megatron.core.transformer import TransformerConfig
    v = cfg.virtual_pipeline_size()
    return TransformerConfig(
        num_layers=cfg.num_layers, hidden_size=cfg.hidden_size,
        num_attention_heads=cfg.num_attention_heads, num_query_groups=cfg.query_groups,
        ffn_hidden_size=cfg.ffn_hidden_size or cfg.default_ffn_hidden_size(),
        hidden_dropout=cfg.hidden_dropout, attention_dropout=cfg.attention_dropout,
        normalization=cfg.normalization, layernorm_epsilon=cfg.model_config().layernorm_epsilon,
        gated_linear_unit=cfg.swiglu, activation_func=F.silu if cfg.swiglu else F.gelu,
        add_bias_linear=cfg.add_bias_linear,
        tensor_model_parallel_size=cfg.tensor_model_parallel_size,
        sequence_parallel=cfg.sequence_parallel,
        pipeline_model_parallel_size=cfg.pipeline_model_parallel_size,
        virtual_pipeline_model_parallel_size=v if v > 1 else None,
        params_dtype=dtype, pipeline_dtype=dtype, use_cpu_initialization=True,
        # Megatron's own init (overwritten by weights.load): it also sets the tensor-parallel
        # attributes (tensor_model_parallel, partition_dim) the grad norm and the map read
        perform_initialization=True,
        bias_activation_fusion=False, bias_dropout_fusion=False, masked_softmax_fusion=False,
        apply_rope_fusion=False, gradient_accumulation_fusion=False, persist_layer_norm=False,
        cross_entropy_loss_fusion=False,
        # batch_p2p_sync: a torch.cuda.synchronize(). Interleaved: Megatron-LM's defaults
        # (arguments.py: overlap_p2p_comm, batch_p2p_comm = not overlap_p2p_comm); batched, with
        # pp = 2 a rank sends its activation and its gradient to the same peer in one batch and
        # the two are matched in the wrong order (tests/test_megatron.py shows it)
        batch_p2p_comm=(v == 1) or batch_p2p, overlap_p2p_comm=(v > 1) and not batch_p2p,
        batch_p2p_sync=False, **moe_config(cfg, dtype))


def moe_config(cfg, dtype) -> dict:
    """The MoE fields of TransformerConfig (labkit's MoEArgs carry Megatron's names; labkit's
    ``num_experts`` is Megatron-LM's --num-experts, TransformerConfig's ``num_moe_experts``).
    The router runs in the run's dtype (``moe_router_dtype`` fp64 in a float64 run, as the oracle);
    every fused MoE kernel off (they need Transformer Engine or CUDA)."""
    if cfg.num_experts is None:
        return {}
    freq = cfg.moe_layer_freq
    return dict(
        num_moe_experts=cfg.num_experts, moe_router_topk=cfg.moe_router_topk,
        moe_ffn_hidden_size=cfg.moe_ffn_hidden_size, moe_layer_freq=freq if isinstance(freq, int) else list(freq),
        moe_aux_loss_coeff=cfg.moe_aux_loss_coeff, moe_z_loss_coeff=cfg.moe_z_loss_coeff,
        moe_router_load_balancing_type=cfg.moe_router_load_balancing_type,
        moe_router_pre_softmax=cfg.moe_router_pre_softmax,
        moe_expert_capacity_factor=cfg.moe_expert_capacity_factor,
        moe_token_drop_policy=cfg.moe_token_drop_policy,
        moe_pad_expert_input_to_capacity=cfg.moe_pad_expert_input_to_capacity,
        moe_shared_expert_intermediate_size=cfg.moe_shared_expert_intermediate_size,
        moe_token_dispatcher_type=cfg.moe_token_dispatcher_type,
        expert_model_parallel_size=cfg.expert_model_parallel_size,
        expert_tensor_parallel_size=cfg.expert_tensor_parallel_size,
        moe_router_dtype="fp64" if dtype == torch.float64 else "fp32",
        moe_grouped_gemm=False, moe_permute_fusion=False)


def block_spec(cfg, tcfg, vp_stage):
    """The decoder block of one chunk: its layers' local spec and :class:`SPTorchNorm` as the final
    norm (a layer spec alone gets transformer_block.py's LayerNormImpl, WrappedTorchNorm)."""
    from megatron.core.transformer.transformer_block import (TransformerBlockSubmodules,
                                                             get_num_layers_to_build)
    from megatron.core.transformer.transformer_layer import get_transformer_layer_offset
    n = get_num_layers_to_build(tcfg, vp_stage=vp_stage)
    first = get_transformer_layer_offset(tcfg, vp_stage=vp_stage)
    moe = cfg.moe_layers()                # 1 for a MoE layer (moe_layer_freq), by global layer
    specs = [layer_spec(cfg, moe=bool(moe[first + i])) for i in range(n)]
    return TransformerBlockSubmodules(layer_specs=specs, layer_norm=SPTorchNorm)


def layer_spec(cfg, moe: bool = False):
    """get_gpt_layer_local_spec with :class:`SPTorchNorm` for every norm (WrappedTorchNorm
    refuses SP). The spec's other modules are Megatron's: ColumnParallelLinear, RowParallelLinear,
    DotProductAttention, MLP, or (``moe``) MoELayer with SequentialMLP experts."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.torch_norm import WrappedTorchNorm
    spec = get_gpt_layer_local_spec(num_experts=cfg.num_experts if moe else None, moe_grouped_gemm=False,
                                    normalization=cfg.normalization)
    _swap(spec, WrappedTorchNorm, SPTorchNorm)
    return spec


def _swap(spec, old, new, seen=None) -> None:
    """Replace ``old`` by ``new`` wherever a ModuleSpec tree names it."""
    from dataclasses import fields, is_dataclass
    seen = set() if seen is None else seen
    if id(spec) in seen or not is_dataclass(spec):
        return
    seen.add(id(spec))
    for f in fields(spec):
        val = getattr(spec, f.name)
        if val is old:
            setattr(spec, f.name, new)
        else:
            _swap(val, old, new, seen)


def build_model(cfg, dtype, batch_p2p: bool = False, device=None) -> list:
    """This rank's GPTModel chunks (one per virtual pipeline stage), DDP-wrapped, on ``device``
    (its GPU under NCCL: built on the CPU, then moved before DDP makes its grad buffers there)."""
    from megatron.core import parallel_state as ps
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.models.gpt import GPTModel
    tcfg = transformer_config(cfg, dtype, batch_p2p)
    v = cfg.virtual_pipeline_size()
    chunks = []
    for vp in range(v):
        vp_stage = vp if v > 1 else None
        model = GPTModel(
            config=tcfg, transformer_layer_spec=block_spec(cfg, tcfg, vp_stage), vocab_size=cfg.model_config().vocab_size,
            max_sequence_length=cfg.seq_length,
            pre_process=ps.is_pipeline_first_stage(ignore_virtual=False, vp_stage=vp_stage),
            post_process=ps.is_pipeline_last_stage(ignore_virtual=False, vp_stage=vp_stage),
            share_embeddings_and_output_weights=not cfg.untie_embeddings_and_output_weights,
            position_embedding_type=cfg.position_embedding_type, rotary_base=cfg.rotary_base,
            vp_stage=vp_stage)
        # the whole chunk in params_dtype, as Megatron's Float16Module casts it to bf16/fp16: the
        # learned position table is a plain torch.nn.Embedding, made in fp32 whatever params_dtype
        chunks.append(_float64_rope(model.to(dtype=dtype, device=device or "cpu"), cfg))
    ddp_cfg = DistributedDataParallelConfig(
        grad_reduce_in_fp32=False, overlap_grad_reduce=False,
        use_distributed_optimizer=cfg.use_distributed_optimizer)
    return [DistributedDataParallel(config=tcfg, ddp_config=ddp_cfg, module=m,
                                    disable_bucketing=(i > 0)) for i, m in enumerate(chunks)], tcfg


def _float64_rope(model, cfg):
    """FLOAT64 (documented, as the cross-entropy and the grad norm of cpu_standins): Megatron's
    RotaryEmbedding (models/common/embeddings/rotary_pos_embedding.py) makes ``inv_freq`` in fp32,
    so its angles (position x inv_freq) and cos/sin are fp32 by design (1e-7 off a float64 oracle).
    In a float64 run the same formula in float64; every later step reads ``inv_freq.dtype``."""
    rope = getattr(model, "rotary_pos_emb", None)
    if rope is not None and model.config.params_dtype == torch.float64:
        d = rope.inv_freq.numel() * 2
        rope.inv_freq = 1.0 / (cfg.rotary_base ** (torch.arange(0, d, 2, dtype=torch.float64,
                                                                 device=rope.inv_freq.device) / d))
    return model


def build_optimizer(cfg, chunks):
    """Megatron's optimizer over the chunks: Adam with decoupled weight decay (torch's AdamW when
    neither Transformer Engine nor Apex is installed), weight decay on every parameter as labkit's
    AdamW (``config_overrides={}``: Megatron's default exempts biases and norms)."""
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    ocfg = OptimizerConfig(optimizer="adam", lr=cfg.lr, min_lr=cfg.lr, weight_decay=cfg.weight_decay,
                           adam_beta1=cfg.adam_beta1, adam_beta2=cfg.adam_beta2, adam_eps=cfg.adam_eps,
                           clip_grad=cfg.clip_grad, bf16=False, fp16=False,
                           use_distributed_optimizer=cfg.use_distributed_optimizer)
    return get_megatron_optimizer(ocfg, chunks, config_overrides={})

"""Megatron-Core's own GPTModel reading labkit's torch_dist export (tests/test_interop_megatron.py).

Run on one gloo rank (``labkit.launch``): megatron-core's ``parallel_state`` is process-global.
CPU stand-ins, each for a CUDA call on a path that does no GPU work here: the model-parallel RNG
tracker's ``fork`` (dropout is 0, so no stream is drawn), ``torch.cuda.current_device`` (RoPE and
the router move their tensors to "the current device"), the router's gating GEMM (Transformer
Engine's, by default: F.linear here) and an explicit causal mask (the default one is built with
``device="cuda"``). MoE uses the all-gather token dispatcher (the all-to-all one opens CUDA
streams).
"""
from __future__ import annotations


def megatron_gpt(cfg):
    """Megatron-Core's GPTModel of labkit's model spec ``cfg`` (local spec, CPU, float64)."""
    import torch
    import torch.nn.functional as F
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.transformer_config import TransformerConfig
    moe = dict(num_moe_experts=cfg.num_experts, moe_router_topk=cfg.moe_router_topk,
               moe_ffn_hidden_size=cfg.moe_ffn_hidden_size, moe_aux_loss_coeff=0.0,
               moe_token_dispatcher_type="allgather") if cfg.num_experts else {}
    tc = TransformerConfig(
        num_layers=cfg.num_layers, hidden_size=cfg.hidden_size, num_attention_heads=cfg.num_attention_heads,
        num_query_groups=cfg.query_groups, ffn_hidden_size=cfg.ffn_hidden_size, normalization=cfg.normalization,
        gated_linear_unit=cfg.swiglu, activation_func=F.silu if cfg.swiglu else F.gelu,
        add_bias_linear=cfg.add_bias_linear, layernorm_epsilon=cfg.layernorm_epsilon, hidden_dropout=0.0,
        attention_dropout=0.0, use_cpu_initialization=True, params_dtype=torch.float64,
        pipeline_dtype=torch.float64, bias_activation_fusion=False, bias_dropout_fusion=False,
        masked_softmax_fusion=False, persist_layer_norm=False, apply_rope_fusion=False,
        gradient_accumulation_fusion=False, **moe)
    spec = get_gpt_layer_local_spec(num_experts=cfg.num_experts, normalization=cfg.normalization)
    return GPTModel(tc, spec, vocab_size=cfg.vocab_size, max_sequence_length=cfg.seq_length,
                    position_embedding_type=cfg.position_embedding_type, rotary_base=cfg.rotary_base,
                    share_embeddings_and_output_weights=not cfg.untie_embeddings_and_output_weights).double().eval()


def _flat(d, out):
    for v in d.values():
        _flat(v, out) if isinstance(v, dict) else out.append(v)
    return out


def load_and_run(folder: str, cfg, tokens):
    """On a gloo rank: build Megatron's model, load ``folder`` with Megatron's own loader, return
    ({key: global shape} of its sharded state dict, the logits of ``tokens`` as Megatron computes
    them, and with RoPE's float32 frequencies computed in float64)."""
    import contextlib

    import torch
    from megatron.core import dist_checkpointing, parallel_state
    from megatron.core.dist_checkpointing.mapping import ShardedTensor, ShardedTensorFactory
    from megatron.core.tensor_parallel.random import get_cuda_rng_tracker
    parallel_state.initialize_model_parallel(1, 1)
    get_cuda_rng_tracker().fork = lambda *a, **k: contextlib.nullcontext()     # stand-in (dropout 0)
    torch.cuda.current_device = lambda: "cpu"                                    # stand-in (RoPE, router)
    from megatron.core.transformer.moe import router
    router.router_gating_linear = lambda x, w, b, dtype: torch.nn.functional.linear(   # stand-in: a TE GEMM
        x.to(dtype), w.to(dtype), None if b is None else b.to(dtype))
    model = megatron_gpt(cfg)
    sharded = model.sharded_state_dict()
    shapes = {}
    for v in _flat(sharded, []):
        if isinstance(v, ShardedTensor):
            shapes[v.key] = tuple(v.global_shape)
        elif isinstance(v, ShardedTensorFactory):   # SwiGLU's fc1 (its [gate; up] pieces): one layer's,
            lead = (cfg.num_layers,) + ((cfg.num_experts,) if ".experts.experts." in v.key else ())  # one expert's
            shapes[v.key] = (*lead, *v.data.shape)
    wanted = {k: v for k, v in sharded.items() if not k.endswith("_extra_state")}   # not written (None on CPU)
    state = dist_checkpointing.load(wanted, folder)
    state = {k: v for k, v in state.items() if k in wanted}      # the common state is merged in too
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and all(k.endswith("_extra_state") for k in missing), (missing, unexpected)
    s = tokens.shape[1]
    run = lambda: model(tokens, torch.arange(s).expand_as(tokens),                        # noqa: E731
                        attention_mask=torch.ones(1, 1, s, s, dtype=torch.bool).triu(1))
    with torch.no_grad():
        shipped = run()
        rope = getattr(model, "rotary_pos_emb", None)
        if rope is not None:      # Megatron computes RoPE's frequencies in float32: lift to float64
            d = 2 * rope.inv_freq.numel()
            rope.inv_freq = 1.0 / (cfg.rotary_base ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
            type(rope).forward.cache_clear()            # its forward is an lru_cache
        lifted = run()
    return shapes, shipped, lifted

"""FLOPs per iteration, MFU and HFU (chapter "Why parallelism: memory and compute").

Two counts, two meanings:

- **Model FLOPs** (MFU): the FLOPs the model needs, whatever the implementation: forward plus a
  backward of twice its cost, 3 x 2 x (multiply-adds). Megatron-LM's current count
  (``num_floating_point_operations``); labkit uses that very function (``megatron.py``), so there
  is one source. Roughly 6 * active parameters * tokens plus the attention scores.
- **Hardware FLOPs** (HFU): what the GPUs actually execute, including recomputation. Narayanan et
  al. 2021, Eq. (3), full activation recompute (one extra forward, so 4x the forward instead of
  3x): F = 96 B s l h^2 (1 + s/(6h) + V/(16 l h)). Their Table 1 reports TFLOP/s with this count.

MFU = model FLOPs / (time * GPUs * peak) (Chowdhery et al. 2022, PaLM, App. B).

**Two conventions for the attention scores** (QK^T and AV, 4 s^2 q FLOPs per layer and sequence
forward). Megatron-LM's current count, and so labkit's, halves them because a causal mask makes
half the score matrix unused (``convention="causal"``). PaLM App. B counts them in full
(6N + 12 L H Q T per token), and so do torchtitan, Llama 3 and MegaScale (``convention="palm"``),
as did Megatron-LM itself up to 2024 (r0.8's 12Bslh^2(... + s/h ...)). The same run thus has a
higher MFU in PaLM's convention; the difference is 6 s^2 q L per sequence, large at long context.
Compare MFUs only in one convention.
"""
from __future__ import annotations

from .config import ModelConfig, ParallelConfig
from .megatron import flops_per_iteration, megatron_args


def megatron_kwargs(model: ModelConfig, par: ParallelConfig) -> dict:
    """The Megatron-LM arguments (as keyword arguments) of a labkit model and layout."""
    kw = dict(
        num_layers=model.num_layers, hidden_size=model.hidden_size,
        num_attention_heads=model.num_attention_heads, seq_length=model.seq_length,
        vocab_size=model.vocab_size, make_vocab_size_divisible_by=model.make_vocab_size_divisible_by,
        ffn_hidden_size=model.ffn_hidden_size, kv_channels=model.kv_channels, swiglu=model.swiglu,
        normalization=model.normalization,
        untie_embeddings_and_output_weights=model.untie_embeddings_and_output_weights,
        tensor_model_parallel_size=par.tp, pipeline_model_parallel_size=par.pp,
        context_parallel_size=par.cp, expert_model_parallel_size=par.ep,
        num_layers_per_virtual_pipeline_stage=(None if par.uneven_pipeline
                                               else par.num_layers_per_virtual_pipeline_stage),
        sequence_parallel=par.sequence_parallel, micro_batch_size=par.micro_batch_size,
        global_batch_size=par.gbs, use_distributed_optimizer=par.optimizer_shard_stage >= 1,
        recompute_granularity=par.recompute_granularity)
    if par.uneven_pipeline and par.num_layers_per_virtual_pipeline_stage is not None:
        from .config import virtual_pipeline_size
        kw.update(num_virtual_stages_per_pipeline_rank=virtual_pipeline_size(model, par))
    if model.num_query_groups is not None:
        kw.update(group_query_attention=True, num_query_groups=model.num_query_groups)
    if model.num_experts is not None:
        freq = model.moe_layer_freq
        kw.update(num_experts=model.num_experts, moe_router_topk=model.moe_router_topk,
                  moe_ffn_hidden_size=model.moe_ffn_hidden_size,
                  moe_layer_freq=freq if isinstance(freq, int) else list(freq),
                  moe_shared_expert_intermediate_size=model.moe_shared_expert_intermediate_size,
                  expert_tensor_parallel_size=par.etp, add_bias_linear=model.add_bias_linear)
    return kw


def model_flops_per_iteration(model: ModelConfig, par: ParallelConfig) -> float:
    """Model FLOPs of one optimizer step (global batch), Megatron-LM's count.

    FLOPs do not depend on the pipeline split, so it is counted for the layout without PP
    (same TP, CP, DP and batch): uneven splits need no support from megatron_args."""
    flat = par.with_(world_size=par.world_size // par.pp, pipeline_model_parallel_size=1,
                     num_layers_per_virtual_pipeline_stage=None, decoder_first_pipeline_num_layers=None,
                     decoder_last_pipeline_num_layers=None, account_for_embedding_in_pipeline_split=False,
                     account_for_loss_in_pipeline_split=False)
    return flops_per_iteration(megatron_args(flat.world_size, **megatron_kwargs(model, flat)))


def attention_score_flops(model: ModelConfig, global_batch_size: int) -> float:
    """The causal half of the score FLOPs of one step: 6 B s^2 q L (forward + backward).

    Adding it once more turns the causal convention into PaLM's full count."""
    q = model.kv_channels * model.num_attention_heads
    return 6.0 * global_batch_size * model.seq_length ** 2 * q * model.num_layers


def model_flops(model: ModelConfig, par: ParallelConfig, convention: str = "causal") -> float:
    """Model FLOPs of one step in ``convention`` "causal" (Megatron-LM, labkit) or "palm" (full)."""
    if convention not in ("causal", "palm"):
        raise ValueError(f"convention must be 'causal' or 'palm', got {convention!r}")
    f = model_flops_per_iteration(model, par)
    return f + attention_score_flops(model, par.gbs) if convention == "palm" else f


def model_flops_per_token(model: ModelConfig) -> float:
    """Model FLOPs per token (forward + backward)."""
    one = ParallelConfig(world_size=1, micro_batch_size=1)
    return model_flops_per_iteration(model, one) / model.seq_length


def paper_flops_per_iteration(model: ModelConfig, global_batch_size: int, recompute=True) -> float:
    """Narayanan et al. 2021, Eq. (3): 96 B s l h^2 (1 + s/6h + V/16lh), with full recompute.

    Without recompute the layers' factor is 72 instead of 96 (3 passes instead of 4); the logit
    term (V/(16lh), 6 B s h V) is not recomputed either way.
    """
    B, s, l, h = global_batch_size, model.seq_length, model.num_layers, model.hidden_size
    V = model.padded_vocab_size()
    layers = (96 if recompute else 72) * B * s * l * h * h * (1 + s / (6 * h))
    return layers + 6 * B * s * h * V


def utilization(flops, step_time, n_gpus, peak_flops) -> float:
    """Fraction of peak: FLOPs / (step time * GPUs * peak). MFU with model FLOPs, HFU with hardware."""
    if step_time <= 0 or n_gpus < 1 or peak_flops <= 0:
        raise ValueError(f"need step_time > 0, n_gpus >= 1, peak > 0; got {step_time}, {n_gpus}, {peak_flops}")
    return flops / (step_time * n_gpus * peak_flops)


def mfu(model: ModelConfig, par: ParallelConfig, step_time: float, peak_flops: float,
        convention: str = "causal") -> float:
    """The MFU a measured step time implies, in ``convention`` "causal" (labkit) or "palm"."""
    return utilization(model_flops(model, par, convention), step_time, par.world_size, peak_flops)

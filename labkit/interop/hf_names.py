"""labkit's dense names and layouts <-> Hugging Face's, for GPT-2, Llama and Mixtral.

Chapter "Weights that travel". labkit's dense model already uses Megatron-Core's names and fused
layouts (``labkit.model``); Hugging Face keeps other names and, in places, other layouts:

    labkit (= Megatron-Core)                          GPT-2 (GPT2LMHeadModel)
    embedding.word_embeddings.weight   [V, h]         transformer.wte.weight
    embedding.position_embeddings.weight [s, h]       transformer.wpe.weight
    layers.i.input_layernorm / pre_mlp_layernorm      transformer.h.i.ln_1 / ln_2
    self_attention.linear_qkv [(n+2g)d, h]            attn.c_attn.weight [h, 3h]: Conv1D stores W^T,
        rows per group [q | k | v]                        columns [all q | all k | all v]
    self_attention.linear_proj [h, nd]                attn.c_proj.weight [nd, h] (W^T)
    mlp.linear_fc1 / linear_fc2                       mlp.c_fc / mlp.c_proj (W^T)
    decoder.final_layernorm, output_layer             transformer.ln_f, lm_head (absent when tied)

    Llama (LlamaForCausalLM)                          Mixtral (MixtralForCausalLM, on disk)
    linear_qkv -> self_attn.q_proj [nd, h], k_proj [gd, h], v_proj [gd, h] (head i of q reads
        K/V head i // (n/g), in both);  linear_proj -> self_attn.o_proj
    mlp.linear_fc1 [2f, h] = [gate; up] -> mlp.gate_proj, mlp.up_proj; linear_fc2 -> mlp.down_proj
    mlp.router.weight [E, h]                          block_sparse_moe.gate.weight
    mlp.experts.local_experts.e.linear_fc1 = [gate; up] -> block_sparse_moe.experts.e.w1 (gate), w3 (up)
    mlp.experts.local_experts.e.linear_fc2            block_sparse_moe.experts.e.w2
    input_layernorm / pre_mlp_layernorm / final       input_layernorm / post_attention_layernorm / model.norm

RoPE: labkit rotates channel pairs (i, i + d/2) (``modules.rotate_half``), which is exactly Hugging
Face's ``rotate_half``/``apply_rotary_pos_emb`` with cos/sin = cat(freqs, freqs): q and k rows
need no permutation. (The permutation in transformers' ``convert_llama_weights_to_hf.py`` turns
Meta's original interleaved pairs (2i, 2i+1) into this half-split convention; labkit is already there.)
Every transform is a reshape, a slice, a concatenation or a transpose: a round trip is bitwise.
"""
from __future__ import annotations

import contextlib
import warnings

import torch

FAMILIES = ("gpt2", "llama", "mixtral")
LAYER = "decoder.layers.{i}."


@contextlib.contextmanager
def one_process():
    """DCP without a process group, on purpose (a converter is one process): no warning about it."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def family(cfg) -> str:
    """The Hugging Face family that computes what ``cfg`` (a GPTConfig) computes, or ValueError
    naming the labkit feature the family lacks."""
    moe = cfg.num_experts is not None
    if cfg.normalization == "LayerNorm" and not cfg.swiglu and cfg.position_embedding_type == "learned_absolute":
        why = []
        if cfg.query_groups != cfg.num_attention_heads:
            why.append("group-query attention (GPT-2 has one K/V head per query head)")
        if not cfg.add_bias_linear:
            why.append("linears without biases (GPT-2's Conv1D layers always have one)")
        if moe:
            why.append("mixture-of-experts layers (GPT-2 has dense MLPs)")
        if why:
            raise ValueError("no Hugging Face family computes this GPT-2-shaped model: " + "; ".join(why))
        return "gpt2"
    if cfg.normalization != "RMSNorm" or not cfg.swiglu or cfg.position_embedding_type != "rope":
        raise ValueError(f"no Hugging Face family here has {cfg.normalization} + "
                         f"{'SwiGLU' if cfg.swiglu else 'GeLU'} + {cfg.position_embedding_type} positions: "
                         "GPT-2 is LayerNorm + GeLU + learned; Llama and Mixtral are RMSNorm + SwiGLU + RoPE")
    if not moe:
        return "llama"
    return _mixtral_or_refuse(cfg)


def _mixtral_or_refuse(cfg) -> str:
    """Mixtral: every layer MoE, top-k of the logits then a softmax over them (= Mixtral's softmax,
    top-k, renormalize), no token dropping, no shared expert, no biases. Training-only terms (the
    load-balancing and z losses) change no logit and are allowed."""
    why = []
    if cfg.moe_layers().count(0):
        why.append(f"dense layers between MoE layers (moe_layer_freq={cfg.moe_layer_freq!r}; "
                   "every Mixtral layer is MoE)")
    if cfg.moe_shared_expert_intermediate_size:
        why.append("a shared expert (Mixtral has none; Qwen2-MoE / DeepSeek do)")
    if cfg.moe_expert_capacity_factor is not None:
        why.append("an expert capacity (token dropping changes the outputs; Mixtral drops no token)")
    if cfg.moe_router_pre_softmax and cfg.moe_router_topk > 1:
        why.append("moe_router_pre_softmax (top-k of the softmax, not renormalized; Mixtral "
                   "renormalizes the top-k probabilities)")
    if cfg.add_bias_linear:
        why.append("biases in the linears (Mixtral has none)")
    if cfg.moe_ffn_hidden_size != cfg.ffn_hidden_size:
        why.append(f"moe_ffn_hidden_size {cfg.moe_ffn_hidden_size} != ffn_hidden_size "
                   f"{cfg.ffn_hidden_size} (Mixtral has one intermediate_size)")
    if why:
        raise ValueError("this MoE model is not a Mixtral: " + "; ".join(why))
    return "mixtral"


def split_qkv(w, n: int, g: int, d: int):
    """labkit's fused QKV rows [g x (n/g q heads | k | v) x d, ...] -> q [n*d, ...], k, v [g*d, ...]."""
    w = w.reshape(g, n // g + 2, d, *w.shape[1:])
    q = w[:, :n // g].reshape(n * d, *w.shape[3:])
    return q, w[:, n // g].reshape(g * d, *w.shape[3:]), w[:, n // g + 1].reshape(g * d, *w.shape[3:])


def fuse_qkv(q, k, v, n: int, g: int, d: int):
    """The inverse of :func:`split_qkv`."""
    rest = q.shape[1:]
    parts = (q.reshape(g, n // g, d, *rest), k.reshape(g, 1, d, *rest), v.reshape(g, 1, d, *rest))
    return torch.cat(parts, dim=1).reshape((n + 2 * g) * d, *rest)


def _t(w):
    """Conv1D <-> Linear: the transpose, contiguous (safetensors stores contiguous tensors)."""
    return w.t().contiguous()


def _layer_map(cfg, fam: str, i: int) -> list[tuple[str, str]]:
    """(labkit name, HF name) pairs of layer ``i`` copied as they are (no layout change)."""
    L, kinds = LAYER.format(i=i), ("weight", "bias") if cfg.add_bias_linear else ("weight",)
    norms = ("weight", "bias") if cfg.normalization == "LayerNorm" else ("weight",)
    if fam == "gpt2":
        h = f"transformer.h.{i}."
        return [(L + f"input_layernorm.{k}", h + f"ln_1.{k}") for k in norms] + \
               [(L + f"pre_mlp_layernorm.{k}", h + f"ln_2.{k}") for k in norms] + \
               [(L + "self_attention.linear_proj.bias", h + "attn.c_proj.bias"),
                (L + "mlp.linear_fc1.bias", h + "mlp.c_fc.bias"), (L + "mlp.linear_fc2.bias", h + "mlp.c_proj.bias")]
    h = f"model.layers.{i}."
    out = [(L + "input_layernorm.weight", h + "input_layernorm.weight"),
           (L + "pre_mlp_layernorm.weight", h + "post_attention_layernorm.weight")]
    out += [(L + f"self_attention.linear_proj.{k}", h + f"self_attn.o_proj.{k}") for k in kinds]
    if fam == "llama":
        out += [(L + "mlp.linear_fc2." + k, h + "mlp.down_proj." + k) for k in kinds]
    else:
        out.append((L + "mlp.router.weight", h + "block_sparse_moe.gate.weight"))
        out += [(L + f"mlp.experts.local_experts.{e}.linear_fc2.weight", h + f"block_sparse_moe.experts.{e}.w2.weight")
                for e in range(cfg.num_experts)]
    return out


def _top_map(cfg, fam: str) -> list[tuple[str, str]]:
    """(labkit name, HF name) of the embeddings, the final norm and the untied output layer."""
    norms = ("weight", "bias") if cfg.normalization == "LayerNorm" else ("weight",)
    if fam == "gpt2":
        out = [("embedding.word_embeddings.weight", "transformer.wte.weight"),
               ("embedding.position_embeddings.weight", "transformer.wpe.weight")]
        out += [(f"decoder.final_layernorm.{k}", f"transformer.ln_f.{k}") for k in norms]
    else:
        out = [("embedding.word_embeddings.weight", "model.embed_tokens.weight"),
               ("decoder.final_layernorm.weight", "model.norm.weight")]
    if cfg.untie_embeddings_and_output_weights:
        out.append(("output_layer.weight", "lm_head.weight"))
    return out


def to_hf(state: dict, cfg) -> dict:
    """labkit's dense state dict -> {HF name: tensor} of ``family(cfg)``'s checkpoint files."""
    fam = family(cfg)
    n, g, d = cfg.num_attention_heads, cfg.query_groups, cfg.head_dim
    out = {hf: state[lk] for lk, hf in _top_map(cfg, fam)}
    kinds = ("weight", "bias") if cfg.add_bias_linear else ("weight",)
    for i in range(cfg.num_layers):
        L = LAYER.format(i=i)
        out.update({hf: state[lk] for lk, hf in _layer_map(cfg, fam, i)})
        if fam == "gpt2":
            h = f"transformer.h.{i}."
            for k in kinds:   # per group [q|k|v] rows -> [all q | all k | all v] columns (W^T)
                q, kk, v = split_qkv(state[L + f"self_attention.linear_qkv.{k}"], n, g, d)
                fused = torch.cat((q, kk, v))
                out[h + f"attn.c_attn.{k}"] = _t(fused) if k == "weight" else fused
            out[h + "attn.c_proj.weight"] = _t(state[L + "self_attention.linear_proj.weight"])
            out[h + "mlp.c_fc.weight"] = _t(state[L + "mlp.linear_fc1.weight"])
            out[h + "mlp.c_proj.weight"] = _t(state[L + "mlp.linear_fc2.weight"])
            continue
        h = f"model.layers.{i}."
        for k in kinds:
            q, kk, v = split_qkv(state[L + f"self_attention.linear_qkv.{k}"], n, g, d)
            out.update({h + f"self_attn.q_proj.{k}": q, h + f"self_attn.k_proj.{k}": kk,
                        h + f"self_attn.v_proj.{k}": v})
        if fam == "llama":
            for k in kinds:
                gate, up = state[L + f"mlp.linear_fc1.{k}"].chunk(2)      # [gate; up]
                out.update({h + f"mlp.gate_proj.{k}": gate.contiguous(), h + f"mlp.up_proj.{k}": up.contiguous()})
        else:
            for e in range(cfg.num_experts):
                gate, up = state[L + f"mlp.experts.local_experts.{e}.linear_fc1.weight"].chunk(2)
                out.update({h + f"block_sparse_moe.experts.{e}.w1.weight": gate.contiguous(),
                            h + f"block_sparse_moe.experts.{e}.w3.weight": up.contiguous()})
    return out


def from_hf(tensors: dict, cfg) -> dict:
    """{HF name: tensor} of a checkpoint of ``family(cfg)`` -> labkit's dense state dict. Every
    tensor must be used: a name left over (a feature labkit would silently drop) is an error."""
    fam = family(cfg)
    n, g, d = cfg.num_attention_heads, cfg.query_groups, cfg.head_dim
    used, out = set(), {}

    def take(name):
        if name not in tensors:
            raise ValueError(f"the {fam} checkpoint has no tensor {name!r}")
        used.add(name)
        return tensors[name]
    out.update({lk: take(hf) for lk, hf in _top_map(cfg, fam)})
    kinds = ("weight", "bias") if cfg.add_bias_linear else ("weight",)
    for i in range(cfg.num_layers):
        L = LAYER.format(i=i)
        out.update({lk: take(hf) for lk, hf in _layer_map(cfg, fam, i)})
        if fam == "gpt2":
            h = f"transformer.h.{i}."
            for k in kinds:
                fused = take(h + f"attn.c_attn.{k}")
                fused = _t(fused) if k == "weight" else fused          # [3h, h] rows [all q|all k|all v]
                out[L + f"self_attention.linear_qkv.{k}"] = fuse_qkv(*fused.chunk(3), n, g, d)
            out[L + "self_attention.linear_proj.weight"] = _t(take(h + "attn.c_proj.weight"))
            out[L + "mlp.linear_fc1.weight"] = _t(take(h + "mlp.c_fc.weight"))
            out[L + "mlp.linear_fc2.weight"] = _t(take(h + "mlp.c_proj.weight"))
            continue
        h = f"model.layers.{i}."
        for k in kinds:
            out[L + f"self_attention.linear_qkv.{k}"] = fuse_qkv(
                take(h + f"self_attn.q_proj.{k}"), take(h + f"self_attn.k_proj.{k}"),
                take(h + f"self_attn.v_proj.{k}"), n, g, d)
        if fam == "llama":
            for k in kinds:
                out[L + f"mlp.linear_fc1.{k}"] = torch.cat((take(h + f"mlp.gate_proj.{k}"),
                                                            take(h + f"mlp.up_proj.{k}")))
        else:
            for e in range(cfg.num_experts):
                out[L + f"mlp.experts.local_experts.{e}.linear_fc1.weight"] = torch.cat(
                    (take(h + f"block_sparse_moe.experts.{e}.w1.weight"),
                     take(h + f"block_sparse_moe.experts.{e}.w3.weight")))
    left = sorted(set(tensors) - used)
    if left:
        raise ValueError(f"{len(left)} tensors of the {fam} checkpoint have no place in labkit's model "
                         f"(first: {left[:3]}): refusing to drop them")
    return out

"""labkit's model spec <-> a Hugging Face ``config.json``, for GPT-2, Llama and Mixtral.

Chapter "Weights that travel". Each field is mapped both ways; a Hugging Face setting labkit does
not compute is refused with the reason (never silently dropped), so a folder that imports is a
model labkit runs exactly. Field names are those ``transformers`` 5 writes (``rope_parameters``);
older folders' ``rope_theta`` is read too.
"""
from __future__ import annotations

from ..spec import GPTConfig
from .hf_names import family

ARCHITECTURES = {"gpt2": "GPT2LMHeadModel", "llama": "LlamaForCausalLM", "mixtral": "MixtralForCausalLM"}


def hf_config(cfg: GPTConfig, dtype: str = "float32") -> dict:
    """The ``config.json`` of ``cfg`` as its Hugging Face family (ValueError if none matches)."""
    fam = family(cfg)
    common = dict(architectures=[ARCHITECTURES[fam]], model_type=fam, vocab_size=cfg.vocab_size,
                  initializer_range=cfg.init_method_std, dtype=dtype, bos_token_id=None, eos_token_id=None,
                  tie_word_embeddings=not cfg.untie_embeddings_and_output_weights)
    if fam == "gpt2":   # exact-erf GeLU ("gelu"), not GPT-2's tanh approximation ("gelu_new")
        return dict(common, n_embd=cfg.hidden_size, n_layer=cfg.num_layers, n_head=cfg.num_attention_heads,
                    n_positions=cfg.seq_length, n_inner=cfg.ffn_hidden_size, activation_function="gelu",
                    layer_norm_epsilon=cfg.layernorm_epsilon, resid_pdrop=cfg.hidden_dropout,
                    embd_pdrop=cfg.hidden_dropout, attn_pdrop=cfg.attention_dropout, scale_attn_weights=True,
                    scale_attn_by_inverse_layer_idx=False, reorder_and_upcast_attn=False)
    out = dict(common, hidden_size=cfg.hidden_size, intermediate_size=cfg.ffn_hidden_size,
               num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.num_attention_heads,
               num_key_value_heads=cfg.query_groups, head_dim=cfg.head_dim, hidden_act="silu",
               max_position_embeddings=cfg.seq_length, rms_norm_eps=cfg.layernorm_epsilon,
               rope_parameters={"rope_theta": float(cfg.rotary_base), "rope_type": "default"},
               attention_dropout=cfg.attention_dropout)
    if fam == "llama":
        return dict(out, attention_bias=cfg.add_bias_linear, mlp_bias=cfg.add_bias_linear)
    return dict(out, num_local_experts=cfg.num_experts, num_experts_per_tok=cfg.moe_router_topk,
                router_aux_loss_coef=cfg.moe_aux_loss_coeff, router_jitter_noise=0.0, sliding_window=None,
                output_router_logits=False)


def _refuse(fam: str, why: list[str]) -> None:
    if why:
        raise ValueError(f"this {fam} config.json asks for what labkit does not compute: " + "; ".join(why))


def _rope_theta(hf: dict, why: list[str]) -> int:
    rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind != "default":
        why.append(f"RoPE scaling {kind!r} (labkit's RoPE is the plain one)")
    theta = rope.get("rope_theta", hf.get("rope_theta", 10000.0))
    if float(theta) != int(theta):
        why.append(f"rope_theta {theta} is not an integer (labkit's rotary_base is)")
    return int(theta)


def _gpt2(hf: dict) -> GPTConfig:
    why = []
    if hf.get("activation_function", "gelu_new") != "gelu":
        why.append(f"activation_function {hf.get('activation_function', 'gelu_new')!r}: labkit's MLP uses the "
                   "exact GeLU ('gelu'); GPT-2's tanh approximation differs by up to ~1e-3 per activation")
    if hf.get("scale_attn_by_inverse_layer_idx") or not hf.get("scale_attn_weights", True):
        why.append("attention scaled other than by 1/sqrt(head_dim)")
    if hf.get("resid_pdrop", 0.1) != hf.get("embd_pdrop", 0.1):
        why.append("resid_pdrop != embd_pdrop (labkit has one hidden_dropout)")
    _refuse("gpt2", why)
    h = hf["n_embd"]
    return GPTConfig(num_layers=hf["n_layer"], hidden_size=h, num_attention_heads=hf["n_head"],
                     seq_length=hf["n_positions"], vocab_size=hf["vocab_size"],
                     ffn_hidden_size=hf.get("n_inner") or 4 * h, init_method_std=hf.get("initializer_range", 0.02),
                     layernorm_epsilon=hf.get("layer_norm_epsilon", 1e-5), hidden_dropout=hf.get("resid_pdrop", 0.1),
                     attention_dropout=hf.get("attn_pdrop", 0.1),
                     untie_embeddings_and_output_weights=not hf.get("tie_word_embeddings", True))


def _llama_like(hf: dict, fam: str) -> GPTConfig:
    why = []
    h, n = hf["hidden_size"], hf["num_attention_heads"]
    if hf.get("hidden_act", "silu") != "silu":
        why.append(f"hidden_act {hf['hidden_act']!r} (labkit's SwiGLU uses silu)")
    if (hf.get("head_dim") or h // n) != h // n:
        why.append(f"head_dim {hf['head_dim']} != hidden_size / heads = {h // n}")
    bias = bool(hf.get("attention_bias", False))
    if bool(hf.get("mlp_bias", False)) != bias:
        why.append("attention_bias != mlp_bias (labkit's add_bias_linear is one switch)")
    if hf.get("sliding_window"):
        why.append(f"sliding_window {hf['sliding_window']} (labkit's attention is fully causal)")
    if hf.get("router_jitter_noise", 0.0):
        why.append("router_jitter_noise (multiplicative noise on the router's input while training)")
    theta = _rope_theta(hf, why)
    _refuse(fam, why)
    kv = hf.get("num_key_value_heads") or n
    moe = dict(num_experts=hf["num_local_experts"], moe_router_topk=hf["num_experts_per_tok"],
               moe_aux_loss_coeff=hf.get("router_aux_loss_coef", 0.0)) if fam == "mixtral" else {}
    return GPTConfig(num_layers=hf["num_hidden_layers"], hidden_size=h, num_attention_heads=n,
                     seq_length=hf.get("max_position_embeddings", 2048), vocab_size=hf["vocab_size"],
                     ffn_hidden_size=hf["intermediate_size"], init_method_std=hf.get("initializer_range", 0.02),
                     layernorm_epsilon=hf.get("rms_norm_eps", 1e-6), attention_dropout=hf.get("attention_dropout", 0.0),
                     normalization="RMSNorm", swiglu=True, position_embedding_type="rope", rotary_base=theta,
                     group_query_attention=kv != n, num_query_groups=kv if kv != n else None,
                     add_bias_linear=bias, untie_embeddings_and_output_weights=not hf.get("tie_word_embeddings", False),
                     **moe)


def gpt_config(hf: dict) -> GPTConfig:
    """The labkit model spec of a Hugging Face ``config.json`` (a dict), or ValueError with the reason."""
    fam = hf.get("model_type")
    if fam == "gpt2":
        cfg = _gpt2(hf)
    elif fam in ("llama", "mixtral"):
        cfg = _llama_like(hf, fam)
    else:
        raise ValueError(f"model_type {fam!r}: labkit reads {sorted(ARCHITECTURES)}")
    if family(cfg) != fam:   # e.g. a Mixtral config labkit would compute as something else
        raise ValueError(f"this {fam} config maps to labkit's {family(cfg)} layout")
    return cfg

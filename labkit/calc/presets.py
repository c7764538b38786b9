"""Model presets (chapter "Planning a run").

The models of Narayanan et al. 2021, Table 1 (GPT, seq 2048, vocab 51200, from data/), GPT-3 175B
(Brown et al. 2020, Table 2.1: 96 layers, d_model 12288, 96 heads), GPT-2 774M/1.5B (Radford et
al. 2019, Table 2 and the released checkpoints: 36 x 1280 x 20 and 48 x 1600 x 25, context 1024), Llama-3-style GQA +
SwiGLU + RMSNorm + RoPE models (Llama 3 8B/70B shapes: 32 x 4096, 32 heads, 8 KV groups, ffn
14336, vocab 128256; 80 x 8192, 64 heads, 8 groups, ffn 28672), a Mixtral-8x7B-style MoE
(32 x 4096, 32 heads, 8 groups, 8 experts, top-2, expert ffn 14336, vocab 32000; Jiang et al. 2024)
and a DeepSeek-style MoE with shared experts and a dense first layer, the shapes of DeepSeekMoE 16B
(Dai et al. 2024, arXiv:2401.06066, and its released config: 28 x 2048, 16 heads, first layer dense
with ffn 10944, then 64 routed experts of ffn 1408, top-6, 2 shared experts = 2816, vocab 102400,
16.4B parameters; DeepSeek-V3 keeps the pattern, first 3 layers dense, with latent attention, which
these calculators do not model).
"""
from __future__ import annotations

from .config import ModelConfig

_LLAMA = dict(swiglu=True, normalization="RMSNorm", add_bias_linear=False,
              position_embedding_type="rope", untie_embeddings_and_output_weights=True)

MODELS = {
    "gpt2-774m": ModelConfig(36, 1280, 20, seq_length=1024, vocab_size=50257, name="gpt2-774m"),
    "gpt2-1.5b": ModelConfig(48, 1600, 25, seq_length=1024, vocab_size=50257, name="gpt2-1.5b"),
    "gpt3-175b": ModelConfig(96, 12288, 96, seq_length=2048, vocab_size=51200, name="gpt3-175b"),
    "llama3-8b": ModelConfig(32, 4096, 32, seq_length=8192, vocab_size=128256, num_query_groups=8,
                             ffn_hidden_size=14336, name="llama3-8b", **_LLAMA),
    "llama3-70b": ModelConfig(80, 8192, 64, seq_length=8192, vocab_size=128256, num_query_groups=8,
                              ffn_hidden_size=28672, name="llama3-70b", **_LLAMA),
    "mixtral-8x7b": ModelConfig(32, 4096, 32, seq_length=4096, vocab_size=32000, num_query_groups=8,
                                ffn_hidden_size=14336, num_experts=8, moe_router_topk=2,
                                name="mixtral-8x7b", **_LLAMA),
    "deepseek-moe-16b": ModelConfig(28, 2048, 16, seq_length=4096, vocab_size=102400, ffn_hidden_size=10944,
                                    num_experts=64, moe_router_topk=6, moe_ffn_hidden_size=1408,
                                    moe_shared_expert_intermediate_size=2816,
                                    moe_layer_freq=(0,) + (1,) * 27, name="deepseek-moe-16b", **_LLAMA),
}

# Narayanan et al. 2021, Table 1 (heads, hidden, layers); the full rows live in data/.
_TABLE1 = [("1.7B", 24, 2304, 24), ("3.6B", 32, 3072, 30), ("7.5B", 32, 4096, 36),
           ("18B", 48, 6144, 40), ("39B", 64, 8192, 48), ("76B", 80, 10240, 60),
           ("145B", 96, 12288, 80), ("310B", 128, 16384, 96), ("530B", 128, 20480, 105),
           ("1T", 160, 25600, 128)]
for _name, _heads, _hidden, _layers in _TABLE1:
    MODELS[f"megatron-{_name.lower()}"] = ModelConfig(_layers, _hidden, _heads, seq_length=2048,
                                                      vocab_size=51200, name=f"megatron-{_name.lower()}")


def model(name: str) -> ModelConfig:
    """A preset by name; ValueError listing the names otherwise."""
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; choose one of {sorted(MODELS)}")
    return MODELS[name]

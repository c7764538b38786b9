"""Helpers of tests/test_interop*.py: Hugging Face models built from a config (random weights, no
download), and Hugging Face's float32 islands lifted to float64 for an exact comparison.

transformers computes a few things in float32 whatever the model's dtype, on purpose (for bf16
training): RMSNorm (``hidden_states.to(torch.float32)``), RoPE's angles (``inv_freq`` and
``position_ids.float()``) and Mixtral's router softmax (``router_logits.float()``). In a float64
model they round to float32 (~1e-7 relative). :func:`float64_islands` replaces those three
forwards, for the duration of a ``with``, by the same formulas in the input's dtype, so that the
comparison shows the weights' mapping (round-off ~1e-15), and the plain run shows the size of
Hugging Face's own float32 choices.
"""
from __future__ import annotations

import contextlib
from unittest import mock

import torch

transformers = __import__("pytest").importorskip("transformers", reason="pip install -r requirements-interop.txt")
from transformers.models.llama import modeling_llama as ml      # noqa: E402
from transformers.models.mixtral import modeling_mixtral as mx  # noqa: E402


def _rms(self, x):
    return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))


def _rope(self, x, position_ids):
    d = self.inv_freq.shape[0] * 2
    inv = self.config.rope_parameters["rope_theta"] ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    freqs = position_ids[..., None].to(torch.float64) * inv
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(x.dtype), emb.sin().to(x.dtype)


def _router(self, hidden_states):
    logits = torch.nn.functional.linear(hidden_states.reshape(-1, self.hidden_dim), self.weight)
    top, idx = torch.topk(torch.softmax(logits, dim=-1), self.top_k, dim=-1)
    return logits, top / top.sum(dim=-1, keepdim=True), idx


@contextlib.contextmanager
def float64_islands():
    with contextlib.ExitStack() as stack:
        for mod, prefix in ((ml, "Llama"), (mx, "Mixtral")):
            stack.enter_context(mock.patch.object(getattr(mod, prefix + "RMSNorm"), "forward", _rms))
            stack.enter_context(mock.patch.object(getattr(mod, prefix + "RotaryEmbedding"), "forward", _rope))
        stack.enter_context(mock.patch.object(mx.MixtralTopKRouter, "forward", _router))
        yield


# tiny configurations of each family, vocab 256 (labkit's byte vocabulary, so labkit.train reads them)
HF_CONFIGS = {
    "gpt2": lambda: transformers.GPT2Config(vocab_size=256, n_embd=32, n_layer=2, n_head=4, n_positions=16,
                                            activation_function="gelu", resid_pdrop=0.0, embd_pdrop=0.0,
                                            attn_pdrop=0.0, bos_token_id=None, eos_token_id=None),
    "llama": lambda: transformers.LlamaConfig(vocab_size=256, hidden_size=32, intermediate_size=64,
                                              num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=2,
                                              max_position_embeddings=16, rms_norm_eps=1e-5,
                                              rope_parameters={"rope_theta": 500000.0, "rope_type": "default"},
                                              tie_word_embeddings=False),
    "mixtral": lambda: transformers.MixtralConfig(vocab_size=256, hidden_size=32, intermediate_size=64,
                                                  num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=2,
                                                  max_position_embeddings=16, num_local_experts=4,
                                                  num_experts_per_tok=2, rms_norm_eps=1e-5),
}
CLASSES = {"gpt2": "GPT2LMHeadModel", "llama": "LlamaForCausalLM", "mixtral": "MixtralForCausalLM"}


def hf_model(fam: str, seed: int = 0, dtype=torch.float64):
    """A Hugging Face model of ``fam`` with random weights (its own init, from ``seed``), eval mode."""
    torch.manual_seed(seed)
    config = HF_CONFIGS[fam]()
    config._experts_implementation = "eager"   # grouped_mm takes no float64; the loop over experts does
    model = getattr(transformers, CLASSES[fam])(config)
    with torch.no_grad():   # norms init to ones: perturb them so a swapped norm cannot pass
        for name, p in model.named_parameters():
            if "norm" in name or "ln_" in name:
                p.add_(0.1 * torch.randn_like(p))
    return model.to(dtype).eval()


def hf_logits(model, tokens):
    with torch.no_grad():
        return model(input_ids=tokens).logits

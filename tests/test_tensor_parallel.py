"""Tensor parallelism (labkit/tensor_parallel/): parity with the dense model, bytes, activations, RNG.

Chapter "Tensor parallelism". Tier 2 (gloo ranks). Parity is against labkit.model's dense layer or
GPT (an independent code path: no comm, no slicing) and, for training, against
labkit.reference.train_reference (one device, whole batch, plain AdamW).

Tolerances: float64 layer/model parity atol 1e-12, rtol 1e-10 (only summation order differs);
float32 training losses atol 5e-6 (measured <= 7.2e-7 at loss ~5; a missing 1/t or a wrong
gradient moves the step-2 loss by more than 1e-3).
"""
from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

import labkit
from labkit.calc.comm import tp_layer_bytes
from labkit.config import TrainConfig
from labkit.groups import Group
from labkit.measure.activations import labkit_layer_activation_bytes
from labkit.measure.tensor_parallel import block_parity
from labkit.reference import train_reference

F64 = dict(atol=1e-12, rtol=1e-10)
S, B, H, A = 16, 2, 32, 4  # block_parity's defaults: seq, micro batch, hidden, heads


@pytest.fixture(scope="module")
def blocks():
    """{tp: per-rank results of one TransformerLayer, dense vs cut over tp ranks (no SP)}."""
    return {tp: block_parity(tp, sequence_parallel=False) for tp in (1, 2, 4)}


def textbook_block():
    """(output, input gradient) of the layer block_parity builds (same seeds, same draws), computed
    here from its weights with torch's own ops: F.layer_norm, F.scaled_dot_product_attention
    (causal), F.gelu. Shares no code with labkit.model, so a fault in the code the dense layer and
    the cut one share (the attention, the QKV split, the residuals) shows at every tp, tp = 1
    included; the dense comparison alone sees only what the cut changes."""
    import torch.nn.functional as F

    from labkit.model import GPTConfig, TransformerLayer
    gen = torch.Generator().manual_seed(0)                   # block_parity's seed and order of draws
    layer = TransformerLayer(GPTConfig(num_layers=1, hidden_size=H, num_attention_heads=A,
                                       seq_length=S, vocab_size=256)).double()
    P = {}
    for n, p in layer.named_parameters():
        P[n] = torch.randn(p.shape, generator=gen, dtype=torch.float64) * 0.2 + (p.dim() == 1) * 0.5
    x = torch.randn(B, S, H, generator=gen, dtype=torch.float64).requires_grad_()
    dy = torch.randn(B, S, H, generator=gen, dtype=torch.float64)

    def ln(t, name):
        return F.layer_norm(t, (H,), P[name + ".weight"], P[name + ".bias"], 1e-5)
    a = "self_attention."
    qkv = F.linear(ln(x, "input_layernorm"), P[a + "linear_qkv.weight"], P[a + "linear_qkv.bias"])
    q, k, v = qkv.view(B, S, A, 3, H // A).permute(3, 0, 2, 1, 4)       # per head [q | k | v]: [B, A, S, d]
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, S, H)
    x1 = x + F.linear(y, P[a + "linear_proj.weight"], P[a + "linear_proj.bias"])
    hmid = F.gelu(F.linear(ln(x1, "pre_mlp_layernorm"), P["mlp.linear_fc1.weight"], P["mlp.linear_fc1.bias"]))
    out = x1 + F.linear(hmid, P["mlp.linear_fc2.weight"], P["mlp.linear_fc2.bias"])
    out.backward(dy)
    return out.detach(), x.grad


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_block_output_input_grad_and_every_weight_grad_equal_dense(blocks, tp):
    """Each rank's output, input gradient and 12 parameter gradients equal the dense layer's
    (what the cut changes), and the output and input gradient equal the textbook layer's
    (:func:`textbook_block`: what the cut and the dense layer share). At tp = 1 the first
    comparison is the layer with itself; the second is what lets it fail."""
    ranks = blocks[tp]
    assert len(ranks) == tp
    out, x_grad = textbook_block()
    for r, res in enumerate(ranks):
        # output, input gradient, and 12 parameter gradients (2 norms x 2, qkv/proj/fc1/fc2 x 2)
        assert len(res["pairs"]) == 2 + 12, sorted(res["pairs"])
        for what, (got, expected) in res["pairs"].items():
            assert_close(got, expected, **F64, msg=lambda m: f"tp {tp}, rank {r}, {what}: {m}")
        assert_close(res["pairs"]["output"][0], out, **F64, msg=lambda m: f"tp {tp}, rank {r}, textbook output: {m}")
        assert_close(res["pairs"]["input grad"][0], x_grad, **F64,
                     msg=lambda m: f"tp {tp}, rank {r}, textbook input grad: {m}")


@pytest.mark.parametrize("tp", [2, 4])
def test_block_sends_two_all_reduces_forward_two_backward_as_calc(blocks, tp):
    expected = tp_layer_bytes(S, B, H, tp, bytes_per_element=8)  # float64 activations
    for res in blocks[tp]:
        assert set(res["comm"]) == {"all_reduce"}
        assert res["comm"]["all_reduce"]["calls"] == 4       # g after proj, fc2; f's backward x2
        assert res["comm"]["all_reduce"]["bytes"] == pytest.approx(expected["all_reduce"], rel=1e-12)


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_saved_activations_equal_the_itemized_count(blocks, tp):
    expected = sum(labkit_layer_activation_bytes(S, B, H, A, tp, False, bytes_per_element=8).values())
    for res in blocks[tp]:
        assert res["saved_bytes"] == expected, res["saved"]


def test_saved_activations_shrink_with_tp_but_not_below_the_replicated_part(blocks):
    saved = {tp: blocks[tp][0]["saved_bytes"] for tp in (1, 2, 4)}
    assert saved[1] > saved[2] > saved[4]
    replicated = (2 + 2) * S * B * H * 8  # 2 norm inputs + inputs of linear_qkv, linear_fc1
    assert saved[4] > replicated          # Korthikanti's "10 sbh" term: TP alone cannot cut it


# ----------------------------------------------------------------------------------------------
def _gpt_worker(sp: bool, tied: bool):
    """The whole GPT cut by the TP plan vs the dense GPT: loss and every parameter gradient, float64."""
    import copy

    from labkit import comm
    from labkit.groups import world_group
    from labkit.model import GPT, GPTConfig
    from labkit.tensor_parallel.plan import apply_tensor_parallel

    group = world_group()
    t, r = group.size, group.rank
    cfg = GPTConfig(num_layers=2, hidden_size=32, num_attention_heads=4, seq_length=16, vocab_size=512,
                    untie_embeddings_and_output_weights=not tied)
    dense = GPT(cfg, seed=3).double()
    cut = apply_tensor_parallel(copy.deepcopy(dense), group, sequence_parallel=sp)
    gen = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, 256, (2, 16), generator=gen)      # byte ids: rows >= 256 are padding
    labels = torch.randint(0, 256, (2, 16), generator=gen)
    loss_d, loss_t = dense.loss(tokens, labels), cut.loss(tokens, labels)
    loss_d.backward()
    loss_t.backward()
    for p in cut.parameters():              # what the Engine does after the backward
        if getattr(p, "sequence_parallel", False):
            p.grad.copy_(comm.all_reduce(group, p.grad))
    dense_grads = {n: p.grad for n, p in dense.named_parameters()}
    out = {"loss": (loss_t.detach(), loss_d.detach())}
    for name, p in cut.named_parameters():
        g = dense_grads[name]  # the cut model keeps the dense names
        if getattr(p, "tensor_model_parallel", False):
            dim = 1 if name.endswith(("linear_proj.weight", "linear_fc2.weight")) else 0
            assert p.partition_dim == dim, name
            g = g.chunk(t, dim=dim)[r]
        out[name] = (p.grad.detach(), g)
    return out


@pytest.mark.parametrize("tp, sp, tied", [(2, False, True), (4, True, True), (2, True, False)])
def test_tensor_parallel_gpt_loss_and_all_grads_equal_dense(tp, sp, tied):
    for r, res in enumerate(labkit.launch(_gpt_worker, tp, sp, tied)):
        n_params = 4 + 2 * 12 + (0 if tied else 1)   # embeddings 2, final norm 2, 2 layers
        assert len(res) == 1 + n_params, sorted(res)
        for what, (got, expected) in res.items():
            assert_close(got, expected, **F64, msg=lambda m: f"rank {r}, {what}: {m}")


# ----------------------------------------------------------------------------------------------
TRAIN = dict(micro_batch_size=2, global_batch_size=4, hidden_size=32, seq_length=32, num_layers=2)


@pytest.mark.parametrize("tp, world_size", [(2, 2), (4, 4), (2, 4)])
def test_train_losses_equal_single_device_over_5_steps(tp, world_size):
    result = labkit.train(world_size=world_size, steps=5, seed=0, log_interval=0,
                          tensor_model_parallel_size=tp, **TRAIN)
    reference = train_reference(world_size=world_size, steps=5, seed=0, tensor_model_parallel_size=tp, **TRAIN)
    assert_close(torch.tensor(result.losses), torch.tensor(reference), atol=5e-6, rtol=0)
    assert {tuple(sorted(r["coords"].items())) for r in result.ranks} == {
        tuple(sorted(labkit.Topology(world_size, tp=tp).coords(q).items())) for q in range(world_size)}


def test_heads_not_divisible_by_tp_is_a_value_error_naming_the_numbers():
    xl = dict(num_layers=2, hidden_size=1600, num_attention_heads=25, seq_length=32)  # GPT-2 XL's heads
    for tp in (2, 4):
        with pytest.raises(ValueError, match=rf"num_attention_heads divisible by TP; 25 % {tp} != 0"):
            TrainConfig(tensor_model_parallel_size=tp, **xl).validate(tp)
        with pytest.raises(ValueError, match="num_attention_heads divisible by TP; 25"):
            labkit.train(world_size=tp, steps=1, tensor_model_parallel_size=tp, **xl)
    TrainConfig(tensor_model_parallel_size=5, **xl).validate(5)  # 25 heads divide by 5: allowed


def test_apply_tensor_parallel_rejects_bad_shapes_before_any_communication():
    from labkit.model import GPT, GPTConfig
    from labkit.tensor_parallel.plan import apply_tensor_parallel
    fake = Group("tp", (0, 1, 2), None)  # size 3; never communicates: the checks come first
    model = GPT(GPTConfig(num_layers=1, hidden_size=32, num_attention_heads=4, seq_length=8))
    with pytest.raises(ValueError, match="num_attention_heads 4 is not divisible by tensor_model_parallel_size 3"):
        apply_tensor_parallel(model, fake)


def test_plan_is_data_and_names_the_operators():
    from labkit.tensor_parallel.plan import describe, tp_plan
    plain, sp = describe(tp_plan(False)), describe(tp_plan(True))
    assert plain.keys() == sp.keys()
    assert plain["decoder.layers.*.mlp.linear_fc1"].startswith("f -> column")
    assert sp["decoder.layers.*.mlp.linear_fc1"].startswith("g (all-gather seq)")
    assert sp["decoder.layers.*.mlp.linear_fc2"].endswith("g-bar (reduce-scatter seq)")


@pytest.mark.gpu(devices=2)
def test_block_and_training_parity_on_nccl_at_tp_equal_number_of_gpus():
    n = torch.cuda.device_count()
    for sp in (False, True):
        for r, res in enumerate(block_parity(n, sequence_parallel=sp, backend="nccl")):
            for what, (got, expected) in res["pairs"].items():
                assert_close(got, expected, **F64, msg=lambda m: f"nccl tp {n} sp {sp} rank {r} {what}: {m}")
        result = labkit.train(world_size=n, steps=5, backend="nccl", log_interval=0,
                              tensor_model_parallel_size=n, sequence_parallel=sp, **TRAIN)
        reference = train_reference(world_size=n, steps=5, seed=0, tensor_model_parallel_size=n,
                                    sequence_parallel=sp, **TRAIN)
        # float32 on GPU: cuBLAS may split reductions differently from the CPU reference
        assert_close(torch.tensor(result.losses), torch.tensor(reference), atol=1e-4, rtol=0)

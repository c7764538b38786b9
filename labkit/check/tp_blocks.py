"""Checks for the Tensor-parallel lab's whole blocks: a TP attention block built from column- and
row-parallel pieces, and the vocab-parallel cross-entropy.

``tp_attention(student_fn)``: ``student_fn(group, shard, x) -> y``. ``shard`` holds this rank's
a/t heads: ``qkv_weight`` [3h/t, h] and ``qkv_bias`` [3h/t] (Megatron's fused layout, each head's
rows [q | k | v]), ``proj_weight`` [h, h/t] (the columns of those heads) and ``proj_bias`` [h];
``shard["head_dim"]`` is d. x and y are the replicated [b, s, h]. The judge compares with
``labkit.model.SelfAttention`` holding the dense weights: output, input gradient, the four weight
gradients (sliced), and the bytes: one all-reduce of [b, s, h] forward, one backward. A bias added
before the all-reduce (t times) is named as such.

``vocab_parallel_loss(student_fn)``: ``student_fn(group, logits, labels, vocab_start) -> loss [b, s]``
against ``F.cross_entropy`` on the full logits (some about 800: exp overflows unless the global
max is subtracted), and every byte the ranks sent on any group: the logits must never move.
"""
from __future__ import annotations

from . import describe_mismatch, report, sent
from .spec import Spec, failed, ranks, run
from .tp_common import ATOL, OWN_CONJUGATES, RTOL, judge_mlp
from .compare import far, number

TPL = "labkit.tensor_parallel.layers"
OWN_ATTENTION = OWN_CONJUGATES + (f"{TPL}:ColumnParallelLinear.forward", f"{TPL}:RowParallelLinear.forward",
                                  "labkit.model:SelfAttention.forward")
ATTN_GRADS = ("qkv_weight", "qkv_bias", "proj_weight", "proj_bias")


def dense_attention(h: int, heads: int, seed: int):
    """The dense ``SelfAttention`` (random non-zero biases), x and dy [2, 6, h], float64."""
    import torch

    from labkit.model import GPTConfig, SelfAttention
    gen = torch.Generator().manual_seed(seed)
    attn = SelfAttention(GPTConfig(hidden_size=h, num_attention_heads=heads, attention_dropout=0.0)).double()
    with torch.no_grad():
        for p in attn.parameters():
            p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float64) / h ** 0.5)
    x = torch.randn(2, 6, h, generator=gen, dtype=torch.float64)
    dy = torch.randn(2, 6, h, generator=gen, dtype=torch.float64)
    return attn, x, dy


def _cut(qkv_weight, qkv_bias, proj_weight, proj_bias, t: int, r: int) -> dict:
    """Rank r's heads: rows of the fused qkv (whole heads are contiguous), columns of proj."""
    h = proj_weight.shape[0]
    rows, cols = slice(r * 3 * h // t, (r + 1) * 3 * h // t), slice(r * h // t, (r + 1) * h // t)
    return {"qkv_weight": qkv_weight[rows], "qkv_bias": qkv_bias[rows],
            "proj_weight": proj_weight[:, cols], "proj_bias": proj_bias}


def _params(attn, grad: bool = False) -> tuple:
    ps = (attn.linear_qkv.weight, attn.linear_qkv.bias, attn.linear_proj.weight, attn.linear_proj.bias)
    return tuple(p.grad if grad else p for p in ps)


def _attention_worker(student, h: int, heads: int, seed: int):
    from labkit.groups import world_group

    from . import instrument
    instrument.install()
    fn = student.load()["attention"]
    group = world_group()
    attn, x, dy = dense_attention(h, heads, seed)
    shard = {k: v.detach().clone().requires_grad_() for k, v in _cut(*_params(attn), group.size, group.rank).items()}
    xr = x.clone().requires_grad_()
    before = instrument.snapshot()
    with student.banning(OWN_ATTENTION, "the attention block is the exercise"):
        y = fn(group, {**shard, "head_dim": h // heads}, xr)
        y.backward(dy)
    return {"out": y.detach(), "input grad": xr.grad, **{f"{k} grad": shard[k].grad for k in ATTN_GRADS},
            "counts": instrument.difference(instrument.snapshot(), before)}


def _produce_attention(student, world_size=2, hidden_size=16, heads=4, seed=0):
    results, failure = ranks(_attention_worker, world_size, student, hidden_size, heads, seed)
    return failure or results


def _attention_expected(h, heads, seed, t):
    attn, x, dy = dense_attention(h, heads, seed)
    xd = x.clone().requires_grad_()
    y = attn(xd)
    y.backward(dy)
    return [{"out": y.detach(), "input grad": xd.grad,
             **{f"{k} grad": v for k, v in _cut(*_params(attn, grad=True), t, r).items()}}
            for r in range(t)], attn.linear_proj.bias.detach()


ATTENTION_DIAGNOSIS = {
    "forward": "the forward output differs from the dense attention's",
    "times t": "gradients t times too large: the backward of the sum leaving the TP region must be the identity",
    "partial": "the input gradient is only this rank's share: x fed every rank's heads, so its gradient is "
               "a sum over the ranks (f's backward)",
    "other": "some gradients differ: with the output right, look at the backward of each operator"}


def _judge_attention(data, world_size=2, hidden_size=16, heads=4, seed=0):
    title = f"tp_attention ({world_size} ranks, {heads} heads)"
    bad = failed(title, data)
    if bad is not None:
        return bad
    expected, bias = _attention_expected(hidden_size, heads, seed, world_size)
    for r, out in enumerate(data):                      # the classic: the bias added on every rank
        extra = describe_mismatch(out["out"], expected[r]["out"] + (world_size - 1) * bias, ATOL, RTOL)
        if extra is None:
            return report(title, False, f"rank {r}: the output is the dense one plus {world_size - 1} x "
                          "linear_proj's bias: every rank added the bias before the ranks' partial outputs "
                          f"were summed, so it counts {world_size} times",
                          "add proj_bias once, after the all-reduce, to the replicated sum")
    bad = judge_mlp(title, data, expected, world_size, ATTENTION_DIAGNOSIS, ATTN_GRADS)
    if bad is not None:
        return bad
    bad = _bytes(title, data, hidden_size)
    if bad is not None:
        return bad
    return report(title, True, f"output, input gradient and the qkv/proj weight and bias gradients equal the "
                  f"dense attention on every rank (float64, atol {ATOL:g}); one all-reduce forward, one backward")


def _bytes(title, data, h):
    t, n = len(data), 2 * 6 * h * 8
    ideal = 2 * 2 * (t - 1) / t * n
    for r, out in enumerate(data):
        others = [op for op in out["counts"] if op != "all_reduce"]
        got = sent(out["counts"], "all_reduce")
        if others or far(got, ideal, 0.5):
            what = ", ".join(f"{op} {v['bytes']:.0f}" for op, v in sorted(out["counts"].items())) or "nothing"
            return report(title, False, f"right values, but rank {r} sent {what} bytes; Megatron's block sends "
                          f"one all-reduce of the [b, s, h] output forward and one of the input gradient "
                          f"backward: {ideal:.0f}", "gather nothing: each rank computes its own heads only")
    return None


ATTENTION = Spec(
    "tp-attention", {"attention": "my_tp_attention"}, _produce_attention, _judge_attention,
    cases=({"world_size": 2}, {"world_size": 4}), forbid=OWN_ATTENTION, ranks=True,
    why="the attention block is the exercise", hints=(
        "draw the shapes: which of x, qkv, the heads' outputs and the projection are full on every rank, "
        "and which hold only this rank's a/t heads?",
        "f(x), then F.linear with the qkv shard gives [b, s, 3h/t]; view it [b, s, a/t, 3d] and split the "
        "last dim into q, k, v (each head's rows are [q | k | v]); attend over each local head",
        "concatenate the local heads to [b, s, h/t], multiply by proj_weight: a partial sum; f-bar sums the "
        "ranks' partials; proj_bias is added once, after the sum"))


def tp_attention(student_fn, world_size: int = 2, hidden_size: int = 16, heads: int = 4, seed: int = 0):
    """``student_fn(group, shard, x) -> y``: a tensor-parallel attention block (see the module)."""
    return run(ATTENTION, {"attention": student_fn}, world_size=world_size, hidden_size=hidden_size,
               heads=heads, seed=seed)


# -- the vocab-parallel cross-entropy ---------------------------------------------------------------
VP = "labkit.tensor_parallel.vocab_parallel"
OWN_VOCAB_LOSS = (f"{VP}:vocab_parallel_cross_entropy", f"{VP}:_VocabParallelCrossEntropy.forward",
                  f"{VP}:VocabParallelCrossEntropyLoss.forward", f"{VP}:cross_entropy_from_parts",
                  f"{VP}:target_logits")


def vocab_inputs(vocab: int, seed: int):
    import torch
    gen = torch.Generator().manual_seed(seed)
    logits = 3 * torch.randn(2, 6, vocab, generator=gen, dtype=torch.float64)
    logits[1] += 800.0                      # large logits: exp() overflows unless the max is subtracted
    labels = torch.randint(0, vocab, (2, 6), generator=gen)
    return logits, labels


def _vocab_worker(student, vocab: int, seed: int):
    import torch

    from labkit.groups import world_group

    from . import instrument
    instrument.install()
    fn = student.load()["loss"]
    group = world_group()
    t, r = group.size, group.rank
    logits, labels = vocab_inputs(vocab, seed)
    per = vocab // t
    shard = logits[..., r * per:(r + 1) * per].clone()
    before = instrument.snapshot()
    with student.banning(OWN_VOCAB_LOSS, "the vocab-parallel loss is the exercise"):
        got = fn(group, shard, labels, r * per)
    return {"got": None if got is None else torch.as_tensor(got).detach(),
            "counts": instrument.difference(instrument.snapshot(), before)}


def _produce_vocab(student, world_size=2, vocab_size=16, seed=0):
    results, failure = ranks(_vocab_worker, world_size, student, vocab_size, seed)
    return failure or results


def _judge_vocab(data, world_size=2, vocab_size=16, seed=0):
    import torch
    import torch.nn.functional as F
    title = f"vocab_parallel_loss ({world_size} ranks)"
    bad = failed(title, data)
    if bad is not None:
        return bad
    logits, labels = vocab_inputs(vocab_size, seed)
    expected = F.cross_entropy(logits.transpose(1, 2), labels, reduction="none")     # [b, s]
    for r, out in enumerate(data):
        if out["got"] is None:
            return report(title, False, f"rank {r} returned None", "return the per-token loss [b, s]")
        got = out["got"]
        if got.shape == expected.shape and not bool(torch.isfinite(got).all()):
            return report(title, False, f"rank {r}: the loss is inf or nan where the logits are large "
                          "(about 800)", "exp(800) overflows: the softmax must be computed stably")
        problem = describe_mismatch(got, expected, 1e-9, 1e-9, what=f"rank {r}, loss ")
        if problem:
            return report(title, False, problem, "the per-token loss differs from F.cross_entropy on the "
                          "full logits")
    b_s = expected.numel()
    bound = 8 * b_s * (world_size + 4)        # all-gather of t maxima + 2 ring all-reduces, in bytes
    total = sent(data[0]["counts"])
    if number(total) is None or total > bound:      # counted in the sandbox: NaN must not pass (nonfinite=True)
        ops = ", ".join(f"{op} {v['bytes']:.0f}" for op, v in sorted(data[0]["counts"].items()))
        return report(title, False, f"right values, but rank 0 sent {total:.0f} bytes ({ops}); three [b, s] "
                      f"collectives send at most {bound}; the logits are {logits.numel() * 8} bytes",
                      "never move the logits: exchange only per-position numbers")
    return report(title, True, f"per-token loss equals F.cross_entropy on the full [b, s, V] logits "
                  f"(float64, tol 1e-9, logits up to 800 included); rank 0 sent {total:.0f} bytes on all "
                  "groups, the logits never moved")


VOCAB_CE = Spec(
    "vocab-parallel-ce", {"loss": "my_vocab_parallel_ce"}, _produce_vocab, _judge_vocab,
    cases=({"world_size": 2}, {"world_size": 4}), forbid=OWN_VOCAB_LOSS, ranks=True,
    nonfinite=True,     # inf/nan from exp(800) is the mistake this exercise teaches: its judge names it
    why="the vocab-parallel loss is the exercise", hints=(
        "loss = log(sum_j exp(z_j)) - z_label: which of these sums and values does one rank not have?",
        "subtract the maximum logit of each position first (the max over ALL ranks' shards: all-gather the "
        "local maxima), so exp() never overflows",
        "three collectives on [b, s] tensors: the max (all-gather of local maxima), the label's logit (zero "
        "where this rank does not own the label, then all-reduce), the sum of exp (all-reduce)"))


def vocab_parallel_loss(student_fn, world_size: int = 2, vocab_size: int = 16, seed: int = 0):
    """``student_fn(group, logits, labels, vocab_start) -> loss [b, s]``: ``logits`` [b, s, V/t] are
    this rank's vocabulary rows [vocab_start, vocab_start + V/t); ``labels`` [b, s] are global ids."""
    return run(VOCAB_CE, {"loss": student_fn}, world_size=world_size, vocab_size=vocab_size, seed=seed)

"""Tier 2: the Tensor-parallel lab's checks pass correct code and FAIL plausible mistakes
with a line that names what is wrong; labkit's own implementation is refused while they run;
hints come on request, one at a time.

Correct solutions are written here independently of the labs' solution cells. Each test asserts
the verdict AND the message, so a check that always passed (or failed uselessly) fails here.
About 30 s on the 2-core machine (2-rank launches). Sequence parallelism: test_check_sequence_parallel.py;
the same checks run in isolation, against attacks: test_check_isolation.py.
"""
import torch
import torch.nn.functional as F

from labkit import comm
from labkit.model import causal_attention
from labkit.check import hints
from labkit.check import tensor_parallel as TP


# ------------------------------------------------------------------ f and f-bar
class CopyTo(torch.autograd.Function):
    @staticmethod
    def forward(ctx, group, x):
        ctx.group = group
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        return None, comm.all_reduce(ctx.group, g)


class ReduceFrom(torch.autograd.Function):
    @staticmethod
    def forward(ctx, group, x):
        return comm.all_reduce(group, x)

    @staticmethod
    def backward(ctx, g):
        return None, g


def f(group, x):
    return CopyTo.apply(group, x)


def f_bar(group, x):
    return ReduceFrom.apply(group, x)


def f_identity(group, x):           # forgets the all-reduce in the backward
    return x


def f_bar_all_reduce_backward(group, x):
    import torch.distributed.nn.functional as dist_nn
    return dist_nn.all_reduce(x, group=group.pg)


def f_labkit(group, x):
    from labkit.tensor_parallel import tp_comm
    return tp_comm.copy_to(group, x)


def test_conjugates_pass_and_name_each_wrong_backward():
    assert TP.conjugates(f, f_bar)
    partial = TP.conjugates(f_identity, f_bar)
    assert not partial and "input grad is a partial sum" in partial.message, partial.line()
    assert partial.hint.startswith("the input gradient is only this rank's share"), partial.hint
    doubled = TP.conjugates(f, f_bar_all_reduce_backward)
    assert not doubled and "input grad = 2 x the dense gradient" in doubled.message, doubled.line()
    assert "fc2_bias" not in doubled.message          # the bias added after the sum is right


def test_hints_come_on_request_one_at_a_time(capsys):
    hints.reset()
    first, second = TP.hint("conjugates"), TP.hint("conjugates")
    assert first.startswith("[hint 1 of 3] conjugates: forward first") and "again for the next" in first
    assert second.startswith("[hint 2 of 3]") and TP.hint("conjugates").startswith("[hint 3 of 3]")
    assert TP.hint("conjugates").startswith("[hint 3 of 3]")          # the last one repeats
    assert TP.hint("vocab-parallel-ce").startswith("[hint 1 of 3]")   # counted per exercise
    hints.reset()


def test_conjugates_refuse_labkits_own_operators():
    result = TP.conjugates(f_labkit, f_bar)
    assert not result
    assert "labkit.tensor_parallel.tp_comm.copy_to is disabled during this check" in result.message


# ------------------------------------------------------------------ the attention block
def attention(group, shard, x, bias_first=False, gather=False):
    d = shard["head_dim"]
    qkv = F.linear(f(group, x), shard["qkv_weight"], shard["qkv_bias"])
    b, s, _ = qkv.shape
    q, k, v = qkv.view(b, s, -1, 3 * d).transpose(1, 2).split(d, dim=-1)
    y = causal_attention(q, k, v).transpose(1, 2).reshape(b, s, -1)
    if gather:                                        # the heads gathered, then the dense projection
        return None
    if bias_first:
        return f_bar(group, F.linear(y, shard["proj_weight"], shard["proj_bias"]))
    return f_bar(group, F.linear(y, shard["proj_weight"])) + shard["proj_bias"]


def attention_bias_first(group, shard, x):
    return attention(group, shard, x, bias_first=True)


def attention_extra_gather(group, shard, x):
    comm.all_gather(group, x)                         # right values, an all-gather too many
    return attention(group, shard, x)


def attention_row_layer(group, shard, x):
    from labkit.tensor_parallel.layers import RowParallelLinear
    return RowParallelLinear(shard["proj_weight"], shard["proj_bias"], group)(x)


def test_tp_attention():
    ok = TP.tp_attention(attention, world_size=2)
    assert ok and "one all-reduce forward, one backward" in ok.message, ok.line()
    bias = TP.tp_attention(attention_bias_first, world_size=2)
    assert not bias and "plus 1 x linear_proj's bias" in bias.message, bias.line()
    assert "once, after the all-reduce" in bias.hint
    extra = TP.tp_attention(attention_extra_gather, world_size=2)
    assert not extra and "all_gather" in extra.message and "all_reduce" in extra.message, extra.line()
    refused = TP.tp_attention(attention_row_layer, world_size=2)
    assert not refused and "RowParallelLinear.forward is disabled" in refused.message, refused.line()


# ------------------------------------------------------------------ vocab-parallel loss
def _target(group, z, labels, start):
    mine = (labels >= start) & (labels < start + z.shape[-1])
    idx = (labels - start).clamp(0, z.shape[-1] - 1)
    return torch.where(mine, z.gather(-1, idx.unsqueeze(-1)).squeeze(-1), torch.zeros(labels.shape, dtype=z.dtype))


def ce_ok(group, logits, labels, start):
    m = comm.all_gather(group, logits.max(-1).values.unsqueeze(0), dim=0).amax(0)
    z = logits - m.unsqueeze(-1)
    return comm.all_reduce(group, z.exp().sum(-1)).log() - comm.all_reduce(group, _target(group, z, labels, start))


def ce_local_max(group, logits, labels, start):   # each rank subtracts its own max: wrong sums
    z = logits - logits.max(-1).values.unsqueeze(-1)
    return comm.all_reduce(group, z.exp().sum(-1)).log() - comm.all_reduce(group, _target(group, z, labels, start))


def ce_no_max(group, logits, labels, start):
    return comm.all_reduce(group, logits.exp().sum(-1)).log() - comm.all_reduce(group, _target(group, logits, labels, start))


def ce_gathers_logits(group, logits, labels, start):
    full = comm.all_gather(group, logits, dim=-1)
    return F.cross_entropy(full.transpose(1, 2), labels, reduction="none")


def test_vocab_parallel_loss():
    ok = TP.vocab_parallel_loss(ce_ok)
    assert ok and "the logits never moved" in ok.message, ok.line()
    wrong = TP.vocab_parallel_loss(ce_local_max)
    assert not wrong and "loss element" in wrong.message, wrong.line()
    overflow = TP.vocab_parallel_loss(ce_no_max)
    assert not overflow and "inf or nan where the logits are large" in overflow.message, overflow.line()
    moved = TP.vocab_parallel_loss(ce_gathers_logits)
    assert not moved and "right values, but rank 0 sent 768 bytes (all_gather 768)" in moved.message, moved.line()

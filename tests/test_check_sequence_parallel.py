"""Tier 2: the Sequence-parallel lab's checks pass correct g / g-bar and a correct whole SP block (with
its gradient sum), and FAIL plausible mistakes with a line that names what is wrong; labkit's own g
refuses to run during them. Correct code is written here independently of the lab's solutions.
About 25 s on the 2-core machine.
"""
import torch

from labkit import comm
import torch.nn.functional as F
from labkit.check import sequence_parallel as SP


# ------------------------------------------------------------------ g and g-bar (sequence parallelism)
class Gather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, group, x):
        ctx.group = group
        return comm.all_gather(group, x, dim=1)

    @staticmethod
    def backward(ctx, g):
        return None, comm.reduce_scatter(ctx.group, g, dim=1)


class ReduceScatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, group, x):
        ctx.group = group
        return comm.reduce_scatter(group, x, dim=1)

    @staticmethod
    def backward(ctx, g):
        return None, comm.all_gather(ctx.group, g, dim=1)


class GatherSplitBackward(Gather):        # backward keeps its chunk without summing: partial grads
    @staticmethod
    def backward(ctx, g):
        return None, g.chunk(ctx.group.size, dim=1)[ctx.group.rank]


def g(group, x):
    return Gather.apply(group, x)


def g_bar(group, x):
    return ReduceScatter.apply(group, x)


def g_split(group, x):
    return GatherSplitBackward.apply(group, x)


def g_labkit(group, x):
    from labkit.tensor_parallel import tp_comm
    return tp_comm.gather_from_sequence(group, x)


def test_sp_conjugates():
    ok = SP.sp_conjugates(g, g_bar)
    assert ok and "the same" in ok.message, ok.line()
    wrong = SP.sp_conjugates(g_split, g_bar)
    assert not wrong and "input grad" in wrong.message and "the backward of an operator is its transpose" in wrong.hint, wrong.line()
    swapped = SP.sp_conjugates(g_bar, g)
    assert not swapped, swapped.line()
    refused = SP.sp_conjugates(g_labkit, g_bar)
    assert not refused and "gather_from_sequence is disabled" in refused.message, refused.line()


def block(group, w, x):
    y = F.layer_norm(x, x.shape[-1:], w["ln_weight"], w["ln_bias"])
    z = g_bar(group, F.linear(F.gelu(F.linear(g(group, y), w["fc1_weight"], w["fc1_bias"])), w["fc2_weight"]))
    return x + z + w["fc2_bias"]


def finalize(group, w):
    for k in ("ln_weight", "ln_bias", "fc2_bias"):
        w[k].grad.copy_(comm.all_reduce(group, w[k].grad))


def finalize_nothing(group, w):
    pass


def finalize_everything(group, w):
    for k in w:
        w[k].grad.copy_(comm.all_reduce(group, w[k].grad) / group.size if k.startswith("fc1") or k == "fc2_weight"
                        else comm.all_reduce(group, w[k].grad))


def test_sp_block_and_its_gradient_sum():
    ok = SP.sp_block(block, finalize)
    assert ok and "finalize all-reduced the 24 numbers" in ok.message, ok.line()
    partial = SP.sp_block(block, finalize_nothing)
    assert not partial and "partial sum" in partial.message and "ln_weight" in partial.message, partial.line()
    wasteful = SP.sp_block(block, finalize_everything)
    assert not wasteful, wasteful.line()

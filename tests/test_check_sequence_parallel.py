"""Tier 2: the Sequence-parallel lab's check passes correct g / g-bar and FAILs plausible mistakes with
a line that names what is wrong; labkit's own g refuses to run during it. Correct operators are
written here independently of the lab's solution. About 15 s on the 2-core machine.
"""
import torch

from labkit import comm
from labkit.check import reset_hints
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
    reset_hints()
    ok = SP.sp_conjugates(g, g_bar)
    assert ok and "the same" in ok.message, ok.line()
    wrong = SP.sp_conjugates(g_split, g_bar)
    assert not wrong and "input grad" in wrong.message and "look at the backwards" in wrong.hint, wrong.line()
    swapped = SP.sp_conjugates(g_bar, g)
    assert not swapped, swapped.line()
    refused = SP.sp_conjugates(g_labkit, g_bar)
    assert not refused and "gather_from_sequence is disabled" in refused.message, refused.line()
    reset_hints()

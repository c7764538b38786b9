"""Tier 2: the PyTorch-native lab's checks fail what they should, for the right reason (issue 26).

The lab master's solutions pass (its stored [check] PASS lines are re-executed by nbval); here the
checks meet a plan with the right numbers but too many bytes, a wrong cut, and a mesh in the wrong
order, and must say which of the three comparisons failed.
"""
from __future__ import annotations

from labkit.check import native as check


def sp_plan_local_output(prefix, sequence_parallel):
    """Torchtitan's SP layer plan, but the gathered input leaves as a plain tensor."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel,
                                                   SequenceParallel)
    return {f"{prefix}.input_layernorm": SequenceParallel(), f"{prefix}.pre_mlp_layernorm": SequenceParallel(),
            f"{prefix}.self_attention": PrepareModuleInput(input_layouts=(Shard(1), None), use_local_output=True,
                                                           desired_input_layouts=(Replicate(), None)),
            f"{prefix}.mlp": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),),
                                                use_local_output=True),
            f"{prefix}.self_attention.linear_qkv": ColwiseParallel(), f"{prefix}.mlp.linear_fc1": ColwiseParallel(),
            f"{prefix}.self_attention.linear_proj": RowwiseParallel(output_layouts=Shard(1)),
            f"{prefix}.mlp.linear_fc2": RowwiseParallel(output_layouts=Shard(1))}


def tp_plan_rows_first(prefix, sequence_parallel):
    """fc1 cut by rows and fc2 by columns: partial sums before the GeLU."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel
    return {f"{prefix}.self_attention.linear_qkv": ColwiseParallel(),
            f"{prefix}.self_attention.linear_proj": RowwiseParallel(),
            f"{prefix}.mlp.linear_fc1": RowwiseParallel(), f"{prefix}.mlp.linear_fc2": ColwiseParallel()}


def test_plan_check_fails_on_bytes_when_the_numbers_are_right(capsys):
    result = check.tp_plan(sp_plan_local_output, sequence_parallel=True)
    assert not result and "right numbers" in result.message and "tp" in result.message


def test_plan_check_fails_on_values_for_a_wrong_cut():
    result = check.tp_plan(tp_plan_rows_first, sequence_parallel=False)
    assert not result
    assert "right numbers" not in result.message     # a value differs (or a shape), not the bytes


def test_mesh_check_names_the_wrong_groups():
    def tp_slowest(world_size, tp):
        from torch.distributed.device_mesh import init_device_mesh
        return init_device_mesh("cpu", (tp, world_size // tp), mesh_dim_names=("tp", "dp"))

    def nothing(model, mesh):
        pass
    result = check.fsdp_tp_mesh(tp_slowest, nothing)
    assert not result and "tp group is [0, 2]" in result.message and "tp varies fastest" in result.message


def test_mesh_judge_alone_rejects_wrong_dimensions_and_hints_escalate():
    """The judge runs no student code (it gets plain data); hints come one at a time on request."""
    from labkit.check import hints
    result = check.FSDP_TP_MESH.judge({"names": ["tp", "dp", "pp"]}, world_size=4, tp=2)
    assert not result and "expected 'dp' and 'tp'" in result.message
    hints.reset("tp-plan")
    first, second = check.hint("tp-plan"), check.hint("tp-plan")
    assert first.startswith("[hint 1 of 4] tp-plan") and second.startswith("[hint 2 of 4] tp-plan")

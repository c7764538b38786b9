"""The pipeline through ``torch.distributed.pipelining`` (chapter "From labkit to PyTorch-native").

labkit's pipeline (``pipeline_parallel/``) is a schedule as data, a p2p plan proven safe and one
executor. PyTorch's is the same three ideas: a ``PipelineStage`` wraps the module a rank holds for
one stage (Megatron's model chunk) and knows its neighbours; a schedule class holds per-rank
action lists (``schedule.pipeline_order``: ``_Action(stage, F|B|I|W, microbatch)``) and runs them,
sending activations and gradients with ``batch_isend_irecv`` on the pp group.

    schedule name            labkit                         stages per rank, placement
    1F1B                     one_f_one_b (Megatron)         1
    Interleaved1F1B          interleaved (Megatron's VPP)   v >= 2, looped: rank r holds r, r+p, ...
    InterleavedZeroBubble    (zb_h1 for v = 1)              v >= 2, looped; backward split I + W
    ZBVZeroBubble            -                              2, V-shaped: rank r holds r and 2p-1-r
    DualPipeV                -                              2, V-shaped; F of one microbatch
                                                            overlapped with B of another

A stage here is labkit's own ``GPT.part`` (the same modules, shared, with the dense names), so the
stages, the TP plan and FSDP apply to it unchanged. Gradients are averaged over the microbatches
by the schedule (``scale_grads=True``: each microbatch's loss is a mean, the step divides by m).
"""
from __future__ import annotations

from ..pipeline_parallel.placement import rank_stages, stage_layers   # the one placement
from .options import V_SHAPED


def stages_per_rank(schedule: str, num_layers: int, pp: int, layers_per_stage: int | None) -> int:
    """v for ``schedule``: 1 for 1F1B, 2 for the V-shaped schedules, else num_layers / (pp *
    layers_per_stage) (Megatron's ``num_layers_per_virtual_pipeline_stage``)."""
    if schedule == "1F1B":
        return 1
    if schedule in V_SHAPED:
        return 2
    return num_layers // (pp * layers_per_stage) if layers_per_stage else 2


def stage_indices(schedule: str, pp: int, pp_rank: int, v: int) -> list[int]:
    """The stage indices (of pp * v) pipeline rank ``pp_rank`` holds, in its local order: labkit's
    one placement (``pipeline_parallel.placement``). Looped (Megatron, torch's ``style="loop"``):
    r, r + p, r + 2p, ...; V-shaped (torch's ``style="v"``): r and 2p - 1 - r, so rank 0 holds the
    first stage and the last one."""
    return rank_stages(pp_rank, pp, v, "v" if schedule in V_SHAPED else "loop")


def build_stages(model, pp_group, schedule: str, v: int, device) -> list:
    """This rank's ``PipelineStage`` objects, each over a ``GPT.part`` of ``model``."""
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage

    pp, r = dist.get_world_size(pp_group), dist.get_rank(pp_group)
    num_stages, layers = pp * v, model.cfg.num_layers
    stages = []
    for s in stage_indices(schedule, pp, r, v):
        part = model.part(stage_layers(layers, num_stages, s), pre_process=s == 0,
                          post_process=s == num_stages - 1)
        stages.append(PipelineStage(part, s, num_stages, device, group=pp_group))
    return stages


def build_schedule(schedule: str, stages: list, n_microbatches: int):
    """A torch schedule over ``stages`` whose loss is labkit's mean cross-entropy per microbatch."""
    from torch.distributed.pipelining.schedules import get_schedule_class

    from ..model import lm_loss
    cls = get_schedule_class(schedule)
    one = stages[0] if schedule == "1F1B" else stages
    return cls(one, n_microbatches, loss_fn=lm_loss, scale_grads=True)


def run_step(sched, stages, tokens, labels) -> float | None:
    """One forward-backward over this rank's local batch (the schedule splits it into its
    microbatches). Returns the mean loss over them on the rank holding the last stage, else None."""
    has_first = any(st.is_first for st in stages)
    has_last = any(st.is_last for st in stages)
    losses: list = []
    args = (tokens,) if has_first else ()
    kwargs = {"target": labels, "losses": losses} if has_last else {}
    sched.step(*args, **kwargs)
    if not has_last:
        return None
    from torch.distributed.tensor import DTensor
    losses = [l.full_tensor() if isinstance(l, DTensor) else l for l in losses]   # loss parallel
    return float(sum(float(l.detach()) for l in losses) / len(losses))

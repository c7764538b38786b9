"""Checks for the PyTorch-native lab: a ``parallelize_module`` plan for one transformer layer, and
a 2-D mesh for FSDP x TP (chapter "From labkit to PyTorch-native").

Two Specs (:mod:`labkit.check.spec`). ``produce`` runs the student's code on gloo ranks in float64
inside one training step of the course GPT (2 layers, hidden 32), labkit's own plan, mesh and FSDP
wrapper banned, and returns the loss, every parameter's gradient reassembled from its DTensor
shards, and the bytes the step sent on each axis (``labkit.native.count.ByteCounter``); for the
mesh, also each rank's dp and tp groups. ``judge`` never runs the student's code: it compares them
with the dense model on one device (an independent reference: the same seed, the whole batch, plain
autograd), the groups with labkit's ``Topology``, and the bytes with what ``labkit.native.bytes``
predicts for the layout, so a plan that replicates a layer, or gathers what it could
reduce-scatter, fails even when its numbers are right.
Visible: the plan on 2 ranks without and with SP, the mesh on 4 ranks with tp 2; hidden: 4 tp
ranks, and a mesh of 4 ranks with tp 4 (``solutions/hidden/pytorch-native-lab.json``).
"""
from __future__ import annotations

import functools

from . import report
from .hints import asker
from .spec import Spec, failed, failure, ranks, run
from .compare import far

ATOL = 1e-10     # float64: only the order of additions differs
MODEL = dict(num_layers=2, hidden_size=32, num_attention_heads=4, seq_length=16, micro_batch_size=2,
             params_dtype="float64")
OWN_PLAN = ("labkit.native.tp_plan:tensor_parallel_plan", "labkit.native.tp_plan:apply_tensor_parallel")
OWN_DP = ("labkit.native.mesh:build_mesh", "labkit.native.fsdp:apply_data_parallel")
WHY_PLAN, WHY_DP = "the layer's plan is the exercise", "the mesh and the sharding are the exercise"


def _cfg(tp: int, sequence_parallel: bool, zero_stage: int = 0):
    from labkit.config import train_config
    return train_config(tensor_model_parallel_size=tp, sequence_parallel=sequence_parallel,
                        zero_stage=zero_stage, **MODEL)


def _batch(cfg, dp_rank: int, dp: int):
    """The whole batch of ``dp`` replicas, and replica ``dp_rank``'s microbatch."""
    from labkit import data
    inputs, labels = data.get_batch(data.load_tokens(), 0, cfg.micro_batch_size * dp, cfg.seq_length, 0)
    lo = dp_rank * cfg.micro_batch_size
    return inputs, labels, inputs[lo:lo + cfg.micro_batch_size], labels[lo:lo + cfg.micro_batch_size]


@functools.lru_cache(maxsize=8)
def reference(tp: int, sequence_parallel: bool, zero_stage: int, dp: int):
    """The dense model's loss and gradients on the whole batch (one device, the judge's own)."""
    from labkit.model import GPT
    cfg = _cfg(tp, sequence_parallel, zero_stage)
    x, y, _, _ = _batch(cfg, 0, dp)
    model = GPT(cfg.model_config(), seed=0).double()
    loss = model(x, y)
    loss.backward()
    return float(loss.detach()), {n: p.grad.detach().clone() for n, p in model.named_parameters()}


def _step(model, axes, x, y, tp: int) -> dict:
    """One forward and backward of ``model`` (cut), counted: {loss, grads (full), bytes per axis}."""
    import contextlib

    import torch.distributed as dist
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.parallel import loss_parallel

    from labkit.native.count import ByteCounter
    from labkit.native.grads import finish_partial_grads
    from labkit.native.tp_plan import dense_grad
    counter = ByteCounter(axes)
    with counter, (loss_parallel() if tp > 1 else contextlib.nullcontext()):
        loss = model(x, y)
        loss.backward()
    with counter:
        finish_partial_grads(list(model.parameters()))
    loss = loss.full_tensor() if isinstance(loss, DTensor) else loss
    grads = {n: dense_grad(model, n, (p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad)
                           .detach().clone())
             for n, p in model.named_parameters() if p.grad is not None}
    total = loss.detach().double().reshape(1).clone()
    dist.all_reduce(total)                       # every rank's replica mean (tp copies of each)
    return {"loss": float(total) / dist.get_world_size(), "grads": grads,
            "bytes": {a: {op: v["bytes"] for op, v in ops.items()} for a, ops in counter.table().items()}}


def _compare(name, out, tp, sequence_parallel, zero_stage, dp, expected_bytes, exercise):
    """A failed CheckResult for the first difference (loss, a gradient, the bytes), else None."""
    ref, ref_grads = reference(tp, sequence_parallel, zero_stage, dp)
    more = f" (check.hint({exercise!r}) for a hint)"
    if not isinstance(out.get("loss"), float) or not isinstance(out.get("grads"), dict):
        return report(name, False, "the step returned no loss or gradients", "keep the form the stub gives")
    if far(out["loss"], ref, ATOL):
        return report(name, False, f"loss {out['loss']:.12f}, the dense model's {ref:.12f}",
                      "some module's layout is not the dense model's" + more)
    grads = out["grads"]
    for n, g in ref_grads.items():
        if n not in grads:
            return report(name, False, f"no gradient for {n}", "every parameter must take part in the step" + more)
        same = tuple(grads[n].shape) == tuple(g.shape)
        diff = float((grads[n].double() - g).abs().max()) if same else float("inf")
        if not diff <= ATOL:                     # NaN is never within
            return report(name, False, f"gradient of {n}: max difference {diff:.3g} from the dense model's",
                          "look at the module this parameter belongs to" + more)
    if out["bytes"] != expected_bytes:
        return report(name, False, f"right numbers, but the step sent {out['bytes']}; the plan of the "
                      f"chapter sends {expected_bytes}", "the layouts are consistent; some tensor moves "
                      "more than it must" + more)
    return None


# -- exercise 1: a layer's plan -------------------------------------------------------------------
def _plan_worker(student, sequence_parallel: bool):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import parallelize_module

    from labkit.model import GPT
    from labkit.native.tp_plan import local_heads, tensor_parallel_plan
    tp = dist.get_world_size()
    cfg = _cfg(tp, sequence_parallel)
    mesh = init_device_mesh("cpu", (tp,), mesh_dim_names=("tp",))
    model = GPT(cfg.model_config(), seed=0).double()
    ends = {k: v for k, v in tensor_parallel_plan(model, sequence_parallel, loss_parallel=True).items()
            if not k.startswith("decoder.layers.")}        # the chapter's embedding, final norm, output
    local_heads(model, tp)                                 # each attention computes its rank's heads
    fn = student.load()["plan"]
    with student.banning(OWN_PLAN, WHY_PLAN):
        layers = {}
        for i in model.decoder.layers.keys():
            layers.update(fn(f"decoder.layers.{i}", sequence_parallel) or {})
    outside = sorted(str(k) for k in layers if not str(k).startswith("decoder.layers."))
    if outside:
        return failure("invalid", f"the plan names modules outside the layers: {outside[:3]}")
    parallelize_module(model, mesh, {**ends, **layers}, src_data_rank=None)
    x, y, _, _ = _batch(cfg, 0, 1)
    return _step(model, {"tp": mesh.get_group("tp")}, x, y, tp)


def _plan_produce(student, world_size=2, sequence_parallel=False):
    results, bad = ranks(_plan_worker, world_size, student, sequence_parallel, timeout=120.0)
    return bad or results[0]


def _plan_judge(data, world_size=2, sequence_parallel=False):
    from labkit.native.bytes import native_step_bytes
    name = f"{'tp_plan_sp' if sequence_parallel else 'tp_plan'} ({world_size} ranks)"
    bad = failed(name, data)
    if bad is not None:
        return bad
    expected = native_step_bytes(_cfg(world_size, sequence_parallel), world_size, _opts())
    problem = _compare(name, data, world_size, sequence_parallel, 0, 1, expected, "tp-plan")
    if problem is not None:
        return problem
    return report(name, True, f"loss and every gradient equal the dense model's (float64, atol {ATOL:g}); "
                  f"the step sent {sum(expected['tp'].values()):,.0f} bytes on tp, the chapter's plan's")


def _opts():
    from labkit.native import NativeOptions
    return NativeOptions()


TP_PLAN = Spec(
    "tp-plan", {"plan": "my_layer_plan"}, _plan_produce, _plan_judge,
    cases=({"world_size": 2, "sequence_parallel": False}, {"world_size": 2, "sequence_parallel": True}),
    forbid=OWN_PLAN, ranks=True, per_rank=False, why=WHY_PLAN, hints=(
        "a wrong loss or gradient: the module it belongs to has the wrong cut; right numbers and wrong "
        "bytes: the layouts are consistent, but some tensor moves more than it must",
        "qkv and fc1 are cut by columns (their outputs are whole heads / a slice of 4h), proj and fc2 by "
        "rows (their outputs are partial sums); under SP the norms run on sequence shards "
        "(SequenceParallel) and attention and the MLP need their whole input",
        "ColwiseParallel() for linear_qkv and linear_fc1, RowwiseParallel() for linear_proj and linear_fc2; "
        "with SP: RowwiseParallel(output_layouts=Shard(1)), SequenceParallel() for both norms, "
        "PrepareModuleInput(input_layouts=(Shard(1), None), desired_input_layouts=(Replicate(), None)) for "
        "self_attention (position_ids passes through) and (Shard(1),) -> (Replicate(),) for mlp",
        "keep PrepareModuleInput's default use_local_output=False, so the gathered input stays a DTensor "
        "into the column-parallel linear (a plain tensor re-wrapped as Replicate() has its gradient "
        "all-reduced where a reduce-scatter would do)"))


# -- exercise 2: a 2-D mesh, TP then FSDP2 ----------------------------------------------------------
def _mesh_worker(student, tp: int):
    import torch.distributed as dist

    from labkit import Topology
    from labkit.model import GPT
    world = dist.get_world_size()
    cfg = _cfg(tp, True, 3)
    model = GPT(cfg.model_config(), seed=0).double()
    fns = student.load()
    with student.banning(OWN_DP, WHY_DP):
        mesh = fns["mesh"](world, tp)
        fns["shard"](model, mesh)
    names = [str(n) for n in (getattr(mesh, "mesh_dim_names", None) or ())]
    out = {"names": names}
    if sorted(names) != ["dp", "tp"]:
        return out
    out["groups"] = {axis: dist.get_process_group_ranks(mesh.get_group(axis)) for axis in ("tp", "dp")}
    topo = Topology(world, tp=tp)
    _, _, xl, yl = _batch(cfg, topo.coords(dist.get_rank())["dp"], topo.dp)
    return {**out, **_step(model, {"dp": mesh.get_group("dp"), "tp": mesh.get_group("tp")}, xl, yl, tp)}


def _mesh_produce(student, world_size=4, tp=2):
    results, bad = ranks(_mesh_worker, world_size, student, tp, timeout=150.0)
    if bad:
        return bad
    return {**results[0], "all_groups": [r.get("groups") for r in results]}


def _mesh_judge(data, world_size=4, tp=2):
    from labkit import Topology
    from labkit.native.bytes import native_step_bytes
    name = f"fsdp_tp_mesh ({world_size} ranks, tp {tp})"
    bad = failed(name, data)
    if bad is not None:
        return bad
    names = data.get("names")
    if sorted(names or []) != ["dp", "tp"]:
        return report(name, False, f"mesh dimensions {tuple(names or ())}, expected 'dp' and 'tp'",
                      "init_device_mesh(..., mesh_dim_names=('dp', 'tp'))")
    topo = Topology(world_size, tp=tp)
    for rank, groups in enumerate(data.get("all_groups") or []):
        for axis in ("tp", "dp"):
            if (groups or {}).get(axis) not in topo.groups(axis):
                return report(name, False, f"rank {rank}'s {axis} group is {(groups or {}).get(axis)}; labkit's "
                              f"Topology has {topo.groups(axis)} (tp varies fastest)",
                              "the last dimension of a mesh varies fastest (check.hint('fsdp-tp-mesh'))")
    expected = native_step_bytes(_cfg(tp, True, 3), world_size, _opts())
    problem = _compare(name, data, tp, True, 3, topo.dp, expected, "fsdp-tp-mesh")
    if problem is not None:
        return problem
    return report(name, True, f"the mesh's dp and tp groups are labkit's; loss and every gradient equal "
                  f"the dense model's (float64, atol {ATOL:g}); bytes per axis as predicted: "
                  + ", ".join(f"{a} {sum(v.values()):,.0f}" for a, v in sorted(expected.items())))


FSDP_TP_MESH = Spec(
    "fsdp-tp-mesh", {"mesh": "my_mesh", "shard": "my_fsdp_tp"}, _mesh_produce, _mesh_judge,
    cases=({"world_size": 4, "tp": 2},), forbid=OWN_DP, ranks=True, per_rank=False, why=WHY_DP, hints=(
        "the message says which comparison failed: the mesh's groups, the numbers, or the bytes",
        "init_device_mesh('cpu', (dp, tp), mesh_dim_names=('dp', 'tp')): the last dimension varies "
        "fastest, so it is tp; cut TP first (apply_tensor_parallel on mesh['tp']), FSDP2 second",
        "fully_shard(layer, mesh=mesh['dp']) for each decoder layer, then fully_shard(model, mesh=mesh['dp']); "
        "reshard_after_forward=True on every unit (the root too) is ZeRO-3: two all-gathers per unit"))

SPECS = {"tp-plan": TP_PLAN, "fsdp-tp-mesh": FSDP_TP_MESH}
hint = asker(SPECS)


def tp_plan(student_fn, sequence_parallel: bool = False, world_size: int = 2):
    """``student_fn(prefix, sequence_parallel) -> {module name: ParallelStyle}`` for the layer named
    ``prefix``; checked inside the whole GPT on ``world_size`` ranks. Prints one [check] line."""
    return run(TP_PLAN, {"plan": student_fn}, world_size=world_size, sequence_parallel=sequence_parallel)


def fsdp_tp_mesh(mesh_fn, shard_fn, world_size: int = 4, tp: int = 2):
    """``mesh_fn(world_size, tp) -> DeviceMesh`` with dimensions ("dp", "tp"), and
    ``shard_fn(model, mesh)``: TP + SP over mesh["tp"], then FSDP2 per layer over mesh["dp"].
    Prints one [check] line."""
    return run(FSDP_TP_MESH, {"mesh": mesh_fn, "shard": shard_fn}, world_size=world_size, tp=tp)

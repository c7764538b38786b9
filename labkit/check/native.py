"""Checks for the PyTorch-native lab: a ``parallelize_module`` plan for one transformer layer, and
a 2-D mesh for FSDP x TP (chapter "From labkit to PyTorch-native").

Both run the student's code on gloo ranks in float64 inside one training step of the course GPT
(2 layers, hidden 32) and compare, against the dense model on one device (an independent
reference: the same seed, the whole batch, plain autograd): the loss, and every parameter's
gradient reassembled from its DTensor shards. Then the bytes: what the step sent on each axis
(``labkit.native.count.ByteCounter``) must be what ``labkit.native.bytes`` predicts for the layout,
so a plan that replicates a layer, or gathers what it could reduce-scatter, fails even when its
numbers are right. labkit's own plan, mesh and FSDP wrapper raise while the student's code runs.
"""
from __future__ import annotations

from . import forbidden, report
from .legacy import hint, run_student

ATOL = 1e-10     # float64: only the order of additions differs
MODEL = dict(num_layers=2, hidden_size=32, num_attention_heads=4, seq_length=16, micro_batch_size=2,
             params_dtype="float64")
OWN_PLAN = ("labkit.native.tp_plan:tensor_parallel_plan", "labkit.native.tp_plan:apply_tensor_parallel")
OWN_DP = ("labkit.native.mesh:build_mesh", "labkit.native.fsdp:apply_data_parallel")


def _reference(cfg, x, y):
    """The dense model's loss and gradients on the whole batch (one device)."""
    from labkit.model import GPT
    model = GPT(cfg.model_config(), seed=0).double()
    loss = model(x, y)
    loss.backward()
    return float(loss), {n: p.grad.detach().clone() for n, p in model.named_parameters()}


def _step(cfg, model, axes, x, y, tp: int):
    """One forward and backward of ``model`` (cut), counted; (loss, {name: full grad}, bytes)."""
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
    return float(total) / dist.get_world_size(), grads, \
        {a: {op: v["bytes"] for op, v in ops.items()} for a, ops in counter.table().items()}


def _batch(cfg, world: int, dp_rank: int, dp: int):
    from labkit import data
    inputs, labels = data.get_batch(data.load_tokens(), 0, cfg.micro_batch_size * dp, cfg.seq_length, 0)
    lo = dp_rank * cfg.micro_batch_size
    return inputs, labels, inputs[lo:lo + cfg.micro_batch_size], labels[lo:lo + cfg.micro_batch_size]


def _plan_worker(student_fn, sequence_parallel: bool):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import parallelize_module

    from labkit.config import train_config
    from labkit.model import GPT
    from labkit.native.tp_plan import local_heads, tensor_parallel_plan
    tp = dist.get_world_size()
    cfg = train_config(tensor_model_parallel_size=tp, sequence_parallel=sequence_parallel, **MODEL)
    mesh = init_device_mesh("cpu", (tp,), mesh_dim_names=("tp",))
    model = GPT(cfg.model_config(), seed=0).double()
    ends = {k: v for k, v in tensor_parallel_plan(model, sequence_parallel, loss_parallel=True).items()
            if not k.startswith("decoder.layers.")}        # the chapter's embedding, final norm, output
    local_heads(model, tp)                                 # each attention computes its rank's heads
    with forbidden(*OWN_PLAN, why="the layer's plan is the exercise"):
        layers = {}
        for i in model.decoder.layers.keys():
            layers.update(student_fn(f"decoder.layers.{i}", sequence_parallel) or {})
    outside = sorted(k for k in layers if not k.startswith("decoder.layers."))
    if outside:
        return {"error": f"the plan names modules outside the layers: {outside[:3]}"}
    parallelize_module(model, mesh, {**ends, **layers}, src_data_rank=None)
    x, y, _, _ = _batch(cfg, tp, 0, 1)
    loss, grads, sent = _step(cfg, model, {"tp": mesh.get_group("tp")}, x, y, tp)
    ref_loss, ref_grads = _reference(cfg, x, y)
    return {"loss": (loss, ref_loss), "grads": (grads, ref_grads), "bytes": sent}


def _compare(name, check, student_fn, out, expected_bytes, hints) -> object | None:
    """A failed CheckResult for the first difference (loss, a gradient, the bytes), else None."""
    if "error" in out:
        return report(name, False, out["error"], hint(check, student_fn, hints["values"], "values"))
    loss, ref = out["loss"]
    if abs(loss - ref) > ATOL:
        return report(name, False, f"loss {loss:.12f}, the dense model's {ref:.12f}",
                      hint(check, student_fn, hints["values"], "values"))
    grads, ref_grads = out["grads"]
    for n, g in ref_grads.items():
        if n not in grads:
            return report(name, False, f"no gradient for {n}", hint(check, student_fn, hints["values"], "values"))
        diff = float((grads[n].double() - g).abs().max()) if grads[n].shape == g.shape else float("inf")
        if diff > ATOL:
            return report(name, False, f"gradient of {n}: max difference {diff:.3g} from the dense model's",
                          hint(check, student_fn, hints["values"], "values"))
    if out["bytes"] != expected_bytes:
        return report(name, False, f"right numbers, but the step sent {out['bytes']}; the plan of the "
                      f"chapter sends {expected_bytes}", hint(check, student_fn, hints["bytes"], "bytes"))
    return None


def tp_plan(student_fn, sequence_parallel: bool = False, world_size: int = 2):
    """``student_fn(prefix, sequence_parallel) -> {module name: ParallelStyle}`` for the layer named
    ``prefix``; checked inside the whole GPT on ``world_size`` ranks. Prints one [check] line."""
    from labkit.config import train_config
    from labkit.native import NativeOptions
    from labkit.native.bytes import native_step_bytes
    check = "tp_plan_sp" if sequence_parallel else "tp_plan"
    name = f"{check} ({world_size} ranks)"
    results, failed = run_student(name, _plan_worker, world_size, student_fn, sequence_parallel,
                                  student_fn=student_fn, timeout=120.0)
    if failed is not None:
        return failed
    cfg = train_config(tensor_model_parallel_size=world_size, sequence_parallel=sequence_parallel, **MODEL)
    expected = native_step_bytes(cfg, world_size, NativeOptions())
    hints = {"values": [
        "some gradient (or the loss) differs from the dense model's: check which module it belongs to",
        "qkv and fc1 are cut by columns (their outputs are whole heads / a slice of 4h), proj and fc2 "
        "by rows (their outputs are partial sums)" + ("; under SP the norms run on sequence shards "
                                                        "(SequenceParallel) and attention and the MLP "
                                                        "need their whole input" if sequence_parallel else ""),
        "ColwiseParallel() for linear_qkv and linear_fc1, RowwiseParallel() for linear_proj and "
        "linear_fc2" + (" with output_layouts=Shard(1); SequenceParallel() for both norms; "
                        "PrepareModuleInput(input_layouts=(Shard(1), None), desired_input_layouts=(Replicate(), "
                        "None)) for self_attention (its second input, position_ids, passes through) and "
                        "the same with (Shard(1),) -> (Replicate(),) for mlp" if sequence_parallel else "")],
        "bytes": ["the numbers are right, so the layouts are consistent; some tensor moves more than it must",
                  "a module left replicated sends nothing in its layer; a plain tensor re-wrapped as "
                  "Replicate() has its gradient all-reduced where a reduce-scatter would do",
                  "keep PrepareModuleInput's default use_local_output=False, so the gathered input "
                  "stays a DTensor into the column-parallel linear"]}
    problem = _compare(name, check, student_fn, results[0], expected, hints)
    if problem is not None:
        return problem
    sent = sum(expected["tp"].values())
    return report(name, True, f"loss and every gradient equal the dense model's (float64, atol {ATOL:g}); "
                  f"the step sent {sent:,.0f} bytes on tp, the chapter's plan's")


def _mesh_worker(mesh_fn, shard_fn, tp: int):
    import torch.distributed as dist

    from labkit import Topology
    from labkit.config import train_config
    from labkit.model import GPT
    world = dist.get_world_size()
    cfg = train_config(tensor_model_parallel_size=tp, sequence_parallel=True, zero_stage=3, **MODEL)
    topo = Topology(world, tp=tp)
    model = GPT(cfg.model_config(), seed=0).double()
    with forbidden(*OWN_DP, why="the mesh and the sharding are the exercise"):
        mesh = mesh_fn(world, tp)
        shard_fn(model, mesh)
    if sorted(mesh.mesh_dim_names or ()) != ["dp", "tp"]:
        return {"error": f"mesh dimensions {mesh.mesh_dim_names}, expected 'dp' and 'tp'"}
    groups = {axis: dist.get_process_group_ranks(mesh.get_group(axis)) for axis in ("tp", "dp")}
    for axis, ranks in groups.items():
        if ranks not in topo.groups(axis):
            return {"error": f"rank {dist.get_rank()}'s {axis} group is {ranks}; labkit's Topology has "
                             f"{topo.groups(axis)} (tp varies fastest)"}
    dp_rank = topo.coords(dist.get_rank())["dp"]
    x, y, xl, yl = _batch(cfg, world, dp_rank, topo.dp)
    loss, grads, sent = _step(cfg, model, {"dp": mesh.get_group("dp"), "tp": mesh.get_group("tp")}, xl, yl, tp)
    ref_loss, ref_grads = _reference(cfg, x, y)
    return {"loss": (loss, ref_loss), "grads": (grads, ref_grads), "bytes": sent}


def fsdp_tp_mesh(mesh_fn, shard_fn, world_size: int = 4, tp: int = 2):
    """``mesh_fn(world_size, tp) -> DeviceMesh`` with dimensions ("dp", "tp"), and
    ``shard_fn(model, mesh)``: TP + SP over mesh["tp"], then FSDP2 per layer over mesh["dp"].
    Prints one [check] line."""
    from labkit.config import train_config
    from labkit.native import NativeOptions
    from labkit.native.bytes import native_step_bytes
    check, name = "fsdp_tp_mesh", f"fsdp_tp_mesh ({world_size} ranks, tp {tp})"
    results, failed = run_student(name, _mesh_worker, world_size, mesh_fn, shard_fn, tp,
                                  student_fn=mesh_fn, timeout=150.0)
    if failed is not None:
        return failed
    cfg = train_config(tensor_model_parallel_size=tp, sequence_parallel=True, zero_stage=3, **MODEL)
    expected = native_step_bytes(cfg, world_size, NativeOptions())
    hints = {"values": [
        "the mesh or the sharding differs from labkit's layout: read the message",
        "init_device_mesh('cpu', (dp, tp), mesh_dim_names=('dp', 'tp')): the last dimension varies "
        "fastest, so it is tp; cut TP first (apply_tensor_parallel on mesh['tp']), FSDP2 second",
        "fully_shard(layer, mesh=mesh['dp']) for each decoder layer, then fully_shard(model, mesh=mesh['dp'])"],
        "bytes": ["right numbers; the collectives differ from FSDP2 per layer",
                  "one fully_shard per decoder layer and one for the root: each unit gathers and reduces "
                  "on its own",
                  "reshard_after_forward=True (the default for non-root units, set it on the root too) "
                  "is ZeRO-3: two all-gathers per unit"]}
    problem = _compare(name, check, mesh_fn, results[0], expected, hints)
    if problem is not None:
        return problem
    return report(name, True, f"the mesh's dp and tp groups are labkit's; loss and every gradient equal "
                  f"the dense model's (float64, atol {ATOL:g}); bytes per axis as predicted: "
                  + ", ".join(f"{a} {sum(v.values()):,.0f}" for a, v in sorted(expected.items())))

"""The parallel layout families an envelope is measured for, and which family a layout is in.

A layout is written as labkit.train keyword arguments (Megatron's names) plus a world size, or on
the command line as ``"tp=2,sp,dp=2,zero=1,cp=2,pp=2,vpp=2,ep=2"`` (:func:`parse_layout`).
The family of a pair is decided from the axes either run uses (:func:`family_of`): one axis
names its family; two or more are "composed".
"""
from __future__ import annotations

# the model every envelope trains (tiny: ~20 steps on 2-4 CPU ranks in seconds); 256 bytes of
# vocabulary pad to 256 under tp <= 4, so the one-device run has the parallel run's vocabulary
MODEL = dict(num_layers=2, hidden_size=32, num_attention_heads=4, seq_length=16, micro_batch_size=2,
             global_batch_size=8, make_vocab_size_divisible_by=64)

# family -> (world size, layout keyword arguments, model changes the layout needs)
FAMILIES = {
    "DP": (2, {}, {}),
    "ZeRO": (2, dict(use_distributed_optimizer=True), {}),
    "TP+SP": (2, dict(tensor_model_parallel_size=2, sequence_parallel=True), {}),
    "CP": (2, dict(context_parallel_size=2), {}),
    "PP/VPP": (2, dict(pipeline_model_parallel_size=2, num_layers_per_virtual_pipeline_stage=1),
               dict(num_layers=4)),
    "EP": (2, dict(expert_model_parallel_size=2), dict(num_experts=2, moe_router_topk=1)),
    "composed": (4, dict(tensor_model_parallel_size=2, sequence_parallel=True, use_distributed_optimizer=True), {}),
}
# the keyword arguments that only cut the model (the one-device run drops them)
LAYOUT_KEYS = ("tensor_model_parallel_size", "sequence_parallel", "context_parallel_size",
               "pipeline_model_parallel_size", "num_layers_per_virtual_pipeline_stage",
               "expert_model_parallel_size", "expert_tensor_parallel_size", "use_distributed_optimizer",
               "zero_stage")
AXES = ("dp", "zero", "tp", "cp", "pp", "ep")
_SHORT = {"tp": "tensor_model_parallel_size", "cp": "context_parallel_size", "pp": "pipeline_model_parallel_size",
          "ep": "expert_model_parallel_size", "zero": "zero_stage"}


def one_device(kwargs: dict) -> dict:
    """The one-device run's keyword arguments: the same model, batch and precision, no cuts."""
    return {k: v for k, v in kwargs.items() if k not in LAYOUT_KEYS}


def axes(world_size: int, kwargs: dict) -> dict:
    """{axis: size} of a layout (dp from the world size), with "zero": the ZeRO stage."""
    tp = kwargs.get("tensor_model_parallel_size", 1)
    pp = kwargs.get("pipeline_model_parallel_size", 1)
    cp = kwargs.get("context_parallel_size", 1)
    if world_size % (tp * pp * cp):
        raise ValueError(f"world size {world_size} is not divisible by tp x pp x cp = {tp * pp * cp}")
    zero = max(int(kwargs.get("zero_stage", 0)), int(bool(kwargs.get("use_distributed_optimizer"))))
    return {"dp": world_size // (tp * pp * cp), "zero": zero, "tp": tp, "cp": cp, "pp": pp,
            "ep": kwargs.get("expert_model_parallel_size", 1)}


def parse_layout(text: str) -> tuple[int, dict]:
    """``"tp=2,sp,dp=2"`` -> (world size, labkit.train keyword arguments). Axes: dp tp cp pp ep
    (sizes), vpp (model chunks per pp rank), zero (stage), sp (a switch); "" or "1" is one device."""
    kw, sizes = {}, {"dp": 1, "tp": 1, "cp": 1, "pp": 1}
    for part in filter(None, (p.strip() for p in text.replace(" ", "").split(","))):
        if part in ("1", "single", "one"):
            continue
        if part == "sp":
            kw["sequence_parallel"] = True
            continue
        key, _, value = part.partition("=")
        if key not in (*AXES, "vpp") or not value.isdigit() or (int(value) < 1 and key != "zero"):
            raise ValueError(f"layout part {part!r}: expected sp, 1, or AXIS=N with AXIS one of "
                             f"dp tp cp pp ep vpp zero and N a positive integer")
        n = int(value)
        if key in sizes:
            sizes[key] = n
        if key == "vpp":
            kw["virtual_pipeline_model_parallel_size"] = n
        elif key != "dp":
            kw[_SHORT[key]] = n
    world = sizes["dp"] * sizes["tp"] * sizes["cp"] * sizes["pp"]
    return world, kw


def family_of(*layouts: tuple[int, dict]) -> str:
    """The family of a pair (or one run): the axes any of them uses with size > 1; ZeRO where the
    only axis is dp with a ZeRO stage; "composed" for two or more; "one device" for none."""
    used = set()
    for world, kw in layouts:
        a = axes(world, kw)
        used |= {k for k in ("tp", "cp", "pp", "ep") if a[k] > 1}
        vpp = kw.get("virtual_pipeline_model_parallel_size") or kw.get("num_layers_per_virtual_pipeline_stage")
        used |= {"pp"} if vpp and a["pp"] > 1 else set()
        if a["dp"] > 1 and a["ep"] == 1:
            used.add("zero" if a["zero"] else "dp")
        elif a["dp"] > 1 and a["zero"]:
            used.add("zero")
    if "ep" in used:                  # expert parallelism rides on the dp ranks: dp is part of it
        used.discard("dp")
    if not used:
        return "one device"
    if len(used) > 1:
        return "composed"
    return {"dp": "DP", "zero": "ZeRO", "tp": "TP+SP", "cp": "CP", "pp": "PP/VPP", "ep": "EP"}[used.pop()]

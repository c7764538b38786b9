"""What does not run on the CPU (gloo), reproduced: each function runs the failing call on the
rank it is launched on and returns the error text ``options`` quotes (tests/test_native_errors.py
checks that they still match, so the chapter's quotes cannot go stale with a new torch).
"""
from __future__ import annotations


def context_parallel_error() -> str:
    """``context_parallel`` around causal ``scaled_dot_product_attention`` on CPU tensors: DTensor
    has no sharding strategy for the CPU flash-attention kernel."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.experimental import context_parallel

    mesh = init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("cp",))
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 8, 4, generator=g) for _ in range(3))     # [b, heads, s, d]
    try:
        with context_parallel(mesh, buffers=[q, k, v], buffer_seq_dims=[2, 2, 2]):
            qq, kk, vv = (t.clone().requires_grad_() for t in (q, k, v))
            F.scaled_dot_product_attention(qq, kk, vv, is_causal=True).sum().backward()
    except Exception as e:  # noqa: BLE001 - the error is the result
        return f"{type(e).__name__}: {e}"
    return "ran"


def comm_debug_pipelining_error() -> str:
    """``CommDebugMode`` around a pipelining step (two stages on this one rank, ZB-V): its module
    tracker's multi-grad hooks meet the stage's ``torch.autograd.grad``."""
    import torch
    import torch.distributed as dist
    from torch.distributed.tensor.debug import CommDebugMode

    from ..config import train_config
    from ..model import GPT
    from .pipeline import build_schedule, build_stages, run_step

    cfg = train_config(num_layers=2, hidden_size=16, seq_length=8, untie_embeddings_and_output_weights=True)
    model = GPT(cfg.model_config(), seed=0)
    stages = build_stages(model, dist.group.WORLD, "ZBVZeroBubble", 2, torch.device("cpu"))
    sched = build_schedule("ZBVZeroBubble", stages, 2)
    x = torch.randint(0, 256, (2, 8))
    try:
        with CommDebugMode():
            run_step(sched, stages, x, x)
    except Exception as e:  # noqa: BLE001
        return f"{type(e).__name__}: {e}"
    return "ran"


def reproduce() -> dict:
    """On one rank (``labkit.launch(reproduce, 1)``): {what: error text}."""
    return {"context_parallel": context_parallel_error(), "CommDebugMode + pipelining": comm_debug_pipelining_error()}

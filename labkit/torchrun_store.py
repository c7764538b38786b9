"""The store of one generation of torchrun's ranks (``--max-restarts``), for ``labkit.launcher``."""
from __future__ import annotations

import datetime
import os

import torch.distributed as dist


def generation_store(world_size: int) -> dict:
    """Under torchrun with the agent's store: {"store", "rank", "world_size"} whose keys are this
    generation's only. After ``--max-restarts`` relaunches the ranks, an external rendezvous store
    (examples/slurm/launch.sh: ``is_host=false``) still holds the dead generation's keys (gloo's
    addresses), and torch adds no per-attempt prefix to it, so the new ranks would connect to dead
    ones; each rank counts itself in (an atomic add) and the count says which generation it is.
    Elsewhere {} (env://, as before)."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return {}
    rank = int(os.environ["RANK"])
    base = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world_size,
                         is_master=False, timeout=datetime.timedelta(seconds=300))
    generation = (base.add(f"labkit/{os.environ.get('TORCHELASTIC_RUN_ID', '')}/ranks", 1) - 1) // world_size
    return {"store": dist.PrefixStore(f"labkit/generation{generation}", base), "rank": rank,
            "world_size": world_size}

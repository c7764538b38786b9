"""Planted in a job (PYTHONPATH): the second node's torchrun agent waits 3 s after checking into the
exit barrier, so the first node's agent always leaves first: the order that ended a successful job
in a traceback when that agent hosted the rendezvous store. ``local_cluster.py --plant slow-agent``."""
import os
import sys
import time

if os.environ.get("SLURM_NODEID") == "1" and "RANK" not in os.environ:   # the agent, not a rank
    import torch.distributed.elastic.utils.store as _store

    _checkin = _store._barrier_nonblocking

    def _slow(*args, **kwargs):
        key = _checkin(*args, **kwargs)
        print("planted: the agent on node 1 is held 3 s in the exit barrier", file=sys.stderr, flush=True)
        time.sleep(3)
        return key

    _store._barrier_nonblocking = _slow

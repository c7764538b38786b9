"""The job's rendezvous store: a TCPStore that lives as long as the batch script, not as an agent.

    python examples/slurm/rendezvous_store.py      # started by launch.sh on the first node

torchrun's c10d rendezvous keeps its state in a TCPStore. Left to itself, the agent on the first node
hosts it, and when that agent leaves first, the other agents lose the store while they still need it
(the exit barrier, then closing the rendezvous): a successful job ends with a
``RendezvousConnectionError`` / ``TCPStore ... Failed to recv`` traceback. Hosted here, the store
outlives every agent. It listens on a free port of this node and prints the port once it listens;
it ends when launch.sh stops it (SIGTERM, after ``srun`` has returned) or when launch.sh is gone.
Chapter "From labkit to Megatron-LM" (book/megatron-bridge.ipynb), section "Many nodes".
"""
import os
import signal
import time
from datetime import timedelta

import torch.distributed as dist


def main() -> None:
    # port 0: the system picks a free port; wait_for_workers=False: agents come and go as they like
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                          timeout=timedelta(seconds=60))
    # launch.sh's trap (or scancel): end now, quietly; a store has nothing to flush, and the
    # interpreter's teardown with torch loaded can take seconds
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    print(store.port, flush=True)                              # launch.sh waits for this line
    parent = os.getppid()
    while os.getppid() == parent:       # serve until stopped, or until launch.sh is gone
        time.sleep(1)


if __name__ == "__main__":
    main()

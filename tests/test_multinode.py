"""Many nodes: two torchrun agents on 127.0.0.1 are two "nodes" of 2 CPU ranks each.

``python -m labkit train`` runs under both agents, started as on a cluster (``--nnodes 2
--node-rank i --rdzv-backend c10d --rdzv-endpoint HOST:PORT``), with TP 2 inside a node and DP 2
across the nodes, reading Megatron's indexed dataset. Its log lines must equal, to the digits they
print, the single-device reference (``labkit.reference``) on the same samples, in float64.
"""
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import torch

from labkit.megatron_bridge import parse_log
from labkit.reference import train_reference

ROOT = Path(__file__).resolve().parent.parent
CONFIG = dict(micro_batch_size=2, global_batch_size=8, tensor_model_parallel_size=2, params_dtype="float64",
              data_path=str(ROOT / "data" / "indexed" / "tinyshakespeare_text_document"))
STEPS = 3


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def flags(config: dict) -> list[str]:
    return [x for k, v in config.items() for x in ("--" + k.replace("_", "-"), str(v))]


def test_two_torchrun_agents_as_two_nodes_match_one_device():
    endpoint = f"127.0.0.1:{free_port()}"
    env = {**os.environ, "LABKIT_BACKEND": "gloo", "PYTHONUNBUFFERED": "1"}
    agents = [subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "2",
         "--node-rank", str(i), "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint,
         "--rdzv-id", "labkit-two-nodes", "-m", "labkit", "train", "--backend", "gloo",
         "--train-iters", str(STEPS), *flags(CONFIG)],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for i in (0, 1)]
    outputs = []
    try:
        for agent in agents:
            out, _ = agent.communicate(timeout=240)
            outputs.append(out)
    finally:
        for agent in agents:
            agent.kill()
    for agent, out in zip(agents, outputs):
        assert agent.returncode == 0, out[-3000:]
    # global rank 0 (on whichever agent the rendezvous made node 0) logged the iterations
    logged = [out for out in outputs if "final lm loss" in out]
    assert len(logged) == 1, outputs
    log = parse_log(logged[0])
    assert list(log["iteration"]) == list(range(1, STEPS + 1))
    assert list(log["consumed_samples"]) == [8, 16, 24]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)                # as each rank runs; the 2 cores are shared
    try:
        ref = train_reference(world_size=4, steps=STEPS, seed=0, **CONFIG)
    finally:
        torch.set_num_threads(threads)
    for printed, exact in zip(log["lm_loss"], ref):           # "%.6E": 7 significant digits
        assert abs(printed - exact) <= 5e-7 * abs(exact), (printed, exact)
    final = float(re.search(r"final lm loss: ([\d.]+)", logged[0]).group(1))
    assert abs(final - ref[-1]) <= 5e-7                         # "%.6f"

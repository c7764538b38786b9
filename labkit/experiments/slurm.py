"""``python -m labkit experiments run ID --slurm``: an sbatch script that runs an experiment on Slurm.

    python -m labkit experiments run 302 --slurm                    # full size, one GPU per rank
    python -m labkit experiments run train-tp2-gpt2-large-2gpu --scale cpu --slurm --nodes 2
    sbatch outdir/<ID>/job.sbatch                                   # from the repository root

The script is the shape of ``examples/slurm/train_2x8.sbatch`` and ``train_cpu.sbatch``: the run's
resources as ``#SBATCH`` lines, then the one launch they share, ``examples/slurm/launch.sh`` (one
torchrun agent per node, the rendezvous store on the first node), which starts
``python -m labkit experiments run ID`` on every rank. The logs land where ``experiments run``
writes them (``OUTDIR/<ID>/logs.txt``), Slurm's own output beside them (``slurm-<job id>.out``).
Chapter "From labkit to Megatron-LM" (book/megatron-bridge.ipynb), section "Many nodes".
"""
from __future__ import annotations

import math
import shlex
from pathlib import Path

from ..validate import positive_int
from .catalogue import get

GPUS_PER_NODE = 8         # a DGX-style node; a run on more GPUs spans ceil(GPUs / 8) nodes
CORES_PER_GPU = 8         # --cpus-per-task per GPU rank (data loading, the launcher): adapt


def layout(experiment_id: str, scale: str = "full", nodes: int | None = None) -> tuple[int, int]:
    """(nodes, ranks per node) of the experiment: its ranks (one per GPU at full size, as many gloo
    ranks at cpu scale) spread evenly over ``nodes`` (default: the fewest 8-GPU nodes; one CPU node)."""
    e = get(experiment_id)
    if scale not in ("cpu", "full"):
        raise ValueError(f"scale must be 'cpu' or 'full', got {scale!r}")
    if nodes is None:
        nodes = math.ceil(e.gpus / GPUS_PER_NODE) if scale == "full" else 1
    if not isinstance(nodes, int) or nodes < 1 or e.gpus % nodes:
        raise ValueError(f"nodes: {e.id} runs {e.gpus} rank(s), which must split evenly over the "
                         f"nodes; {nodes} node(s) do not divide {e.gpus}")
    if scale == "full" and e.gpus // nodes > GPUS_PER_NODE:
        raise ValueError(f"nodes: {e.gpus} GPUs on {nodes} node(s) is {e.gpus // nodes} per node, "
                         f"more than a node's {GPUS_PER_NODE}")
    return nodes, e.gpus // nodes


def script_text(experiment_id: str, scale: str = "full", nodes: int | None = None,
                outdir: str | Path = "outdir", steps: int | None = None) -> str:
    """The sbatch script (text) that runs ``experiment_id`` at ``scale`` on ``nodes`` nodes."""
    e = get(experiment_id)
    nodes, per_node = layout(e.id, scale, nodes)
    positive_int("steps", steps, allow_none=True)
    job_dir = Path(outdir) / e.id
    run = f"-m labkit experiments run {e.id} --scale {scale} \\\n    --outdir {shlex.quote(str(outdir))}"
    run += f" --train-iters {steps}" if steps is not None else ""
    lines = ["#!/bin/bash",
             f"# {e.id}: {e.strategy}, {e.model}, {e.gpus} rank(s) at {scale} scale on {nodes} node(s)"]
    lines += [f"# (the tutorial ran it on {e.hardware})"] if e.hardware else []
    lines += ["# Written by",
              f"#   python -m labkit experiments run {e.id} --scale {scale} \\",
              f"#     --slurm --nodes {nodes}",
              "# Submit from the repository root:",
              f"#   sbatch {shlex.quote(str(job_dir / 'job.sbatch'))}",
              "# The launch is examples/slurm/launch.sh (chapter \"From labkit to Megatron-LM\").",
             f"#SBATCH --job-name={e.id}",
             f"#SBATCH --nodes={nodes}",
             "#SBATCH --ntasks-per-node=1          # one torchrun agent per node; it starts the ranks"]
    if scale == "full":
        lines += [f"#SBATCH --gpus-per-node={per_node}",
                  f"#SBATCH --cpus-per-task={CORES_PER_GPU * per_node}",
                  "#SBATCH --time=00:30:00"]
    else:
        lines += [f"#SBATCH --cpus-per-task={per_node}            # one core per gloo rank",
                  "#SBATCH --time=00:10:00"]
    lines += [f"#SBATCH --output={shlex.quote(str(job_dir / 'slurm-%j.out'))}", "", "set -euo pipefail"]
    if scale == "full":
        if e.tp > 1 or e.cp > 1:   # Megatron's setting; harmless for labkit (see train_2x8.sbatch)
            lines.append("export CUDA_DEVICE_MAX_CONNECTIONS=1")
        lines += ["export TORCH_NCCL_ASYNC_ERROR_HANDLING=1   # a hung collective ends the rank",
                  f"export OMP_NUM_THREADS={CORES_PER_GPU}"]
        if nodes > 1:
            lines += ["# across nodes, name NCCL's interface and adapters as train_2x8.sbatch does",
                      "# (NCCL_SOCKET_IFNAME, NCCL_IB_HCA)"]
    else:
        lines.append("export OMP_NUM_THREADS=1             # one thread per rank")
    lines += ["", f"exec bash examples/slurm/launch.sh {per_node} \\", f"    {run} \"$@\"", ""]
    return "\n".join(lines)


def write_script(experiment_id: str, scale: str = "full", nodes: int | None = None,
                 outdir: str | Path = "outdir", steps: int | None = None) -> Path:
    """Write ``OUTDIR/<ID>/job.sbatch`` (the folder Slurm writes its output to must exist before the
    job starts, so it is made here) and return its path."""
    text = script_text(experiment_id, scale, nodes, outdir, steps)
    path = Path(outdir) / get(experiment_id).id / "job.sbatch"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)
    return path


def main(experiment_id: str, scale: str, nodes: int | None, outdir: str, steps: int | None) -> int:
    """The CLI's ``--slurm``: write the script, say how to submit it."""
    path = write_script(experiment_id, scale, nodes, outdir, steps)
    print(f"wrote {path}; submit it from the repository root:  sbatch {path}")
    return 0

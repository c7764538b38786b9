#!/bin/bash
# One torchrun agent per node of this Slurm job, meeting at a rendezvous store on the first node.
# The one launch shared by train_2x8.sbatch (GPU nodes), train_cpu.sbatch (CPU nodes, gloo) and the
# scripts `python -m labkit experiments run ID --slurm` writes; they differ only in resources.
# Chapter "From labkit to Megatron-LM" (book/megatron-bridge.ipynb), section "Many nodes".
#
#   bash examples/slurm/launch.sh RANKS_PER_NODE -m labkit train FLAGS...   # in an sbatch script
set -euo pipefail
ranks_per_node=$1
shift

# Where the agents meet: the first node of the job, where this batch script runs, at its address
# as Slurm reaches it (NodeAddr: the node's name unless the cluster sets an address).
first_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | sed -n 1p)
MASTER_ADDR=$(scontrol show node "$first_node" | sed -n 's/.*NodeAddr=\([^ ]*\).*/\1/p')

# The rendezvous store runs here, beside this script, not inside an agent: the agents may then
# leave in any order and still find it for their exit barrier and the rendezvous' close, so a
# successful job ends without a traceback. It prints the free port it listens on.
coproc STORE { exec python examples/slurm/rendezvous_store.py; }
trap 'kill "$STORE_PID" 2>/dev/null && wait "$STORE_PID" 2>/dev/null; true' EXIT
read -r -t 120 MASTER_PORT <&"${STORE[0]}"

# One agent per node (the job's --ntasks-per-node=1), RANKS_PER_NODE ranks each, all clients of the
# store (is_host=false). The rendezvous id is the job, so two jobs never mix. A rank that fails
# ends its agent, not restarted (--max-restarts 0), and srun then ends the other agents.
srun --kill-on-bad-exit=1 torchrun \
    --nnodes "$SLURM_NNODES" --nproc-per-node "$ranks_per_node" --max-restarts 0 \
    --rdzv-backend c10d --rdzv-endpoint "$MASTER_ADDR:$MASTER_PORT" --rdzv-id "$SLURM_JOB_ID" \
    --rdzv-conf is_host=false \
    "$@"

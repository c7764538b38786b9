#!/bin/bash
# One torchrun agent per node of this Slurm job; they meet at a rendezvous store on
# the first node. The one launch of train_2x8.sbatch (GPU nodes), train_cpu.sbatch
# (CPU nodes, gloo) and the scripts `python -m labkit experiments run ID --slurm`
# writes: they differ only in their resources. Chapter "From labkit to Megatron-LM",
# section "Many nodes".
#
#   bash examples/slurm/launch.sh RANKS_PER_NODE -m labkit train FLAGS...   # in sbatch
set -euo pipefail
ranks_per_node=$1
shift

# Where the agents meet: the job's first node, where this batch script runs, at its
# address as Slurm reaches it (NodeAddr: the node's name unless the cluster sets one).
first_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | sed -n 1p)
MASTER_ADDR=$(scontrol show node "$first_node" |
              sed -n 's/.*NodeAddr=\([^ ]*\).*/\1/p')

# The rendezvous store runs here, beside this script, not inside an agent: the agents
# may leave in any order and still find it for their exit barrier and the rendezvous'
# close, so a successful job ends without a traceback. It prints the port it is on.
coproc STORE { exec python examples/slurm/rendezvous_store.py; }
trap 'kill "$STORE_PID" 2>/dev/null && wait "$STORE_PID" 2>/dev/null; true' EXIT
read -r -t 120 MASTER_PORT <&"${STORE[0]}"

# One agent per node (--ntasks-per-node=1), RANKS_PER_NODE ranks each, every agent a
# client of the store (is_host=false). The rendezvous id is the job's: jobs never mix.
# A rank that fails ends its agent (no restart), and srun then ends the other agents;
# with LABKIT_MAX_RESTARTS=N every agent instead stops its ranks and starts them again,
# up to N times (torchrun --max-restarts), and `labkit train --load DIR --save DIR`
# resumes from the last complete checkpoint (chapter "When training goes wrong").
# The agent's cores: from Slurm 22.05 to 23.02 srun does not inherit sbatch's
# --cpus-per-task (sbatch(1), "SRUN_CPUS_PER_TASK"; 23.11 inherits it again): a step
# that gets only what it asks for (srun --exact, SLURM_EXACT) then binds the agent and
# all its ranks to one core under task/affinity or task/cgroup. So it is said again.
export SRUN_CPUS_PER_TASK="${SLURM_CPUS_PER_TASK:-1}"
srun --kill-on-bad-exit=1 torchrun \
    --nnodes "$SLURM_NNODES" --nproc-per-node "$ranks_per_node" --max-restarts "${LABKIT_MAX_RESTARTS:-0}" \
    --rdzv-backend c10d --rdzv-endpoint "$MASTER_ADDR:$MASTER_PORT" \
    --rdzv-id "$SLURM_JOB_ID" --rdzv-conf is_host=false \
    "$@"

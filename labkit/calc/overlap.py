"""Which communication hides behind compute: Megatron-LM's overlap flags (chapter "Planning a run").

Defaults are Megatron-LM's (commit d98e8a64): ``--overlap-grad-reduce``, ``--overlap-param-gather``
and ``--tp-comm-overlap`` are off unless given (arguments.py, model_parallel_config.py);
``--overlap-p2p-communication`` is on, but only takes effect with the interleaved schedule
(arguments.py turns it off otherwise). Two more switches describe older code and other frameworks:

- ``async_tp_backward``: the backward all-reduce (reduce-scatter under SP) of a column-parallel
  layer's input gradient runs while the weight-gradient GEMM computes (Megatron since 2022 with
  ``CUDA_DEVICE_MAX_CONNECTIONS=1``; not in the 2021 paper's code, not in DeepSpeed's engine).
- ``scatter_gather_p2p``: Narayanan et al. 2021, Sec. 4.1: each of the t tensor-parallel ranks
  sends 1/t of the activation between pipeline stages and the next stage all-gathers it over
  NVLink. Megatron-LM today sends the sequence-parallel shard instead, which is the same 1/t
  when SP is on; without SP every TP rank sends the whole activation.
- ``blocking_p2p``: DeepSpeed's pipeline engine runs its instructions one after another
  (``PipelineEngine._exec_schedule``) with synchronous sends and receives (``runtime/pipe/p2p.py``
  asserts ``async_op == False``; deepspeedai/DeepSpeed at edaa7221), so a middle stage waits for
  four transfers per microbatch (receive and send the activation, receive and send its gradient);
  Megatron batches a send with the opposite receive (``send_forward_recv_backward``): two.
"""
from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class OverlapConfig:
    overlap_grad_reduce: bool = False      # DP reduce-scatter/all-reduce during the last backward
    overlap_param_gather: bool = False     # ZeRO-1 parameter all-gather during the next forward
    tp_comm_overlap: bool = False          # TE userbuffers: TP collectives pipelined with GEMMs
    overlap_p2p_comm: bool = True          # pipeline sends during compute (interleaved only)
    async_tp_backward: bool = True         # input-grad collective during the weight-grad GEMM
    scatter_gather_p2p: bool = False       # 2021 p2p: s*b*h/t per rank without SP
    blocking_p2p: bool = False             # DeepSpeed pipeline engine: 4 serial transfers per microbatch

    def with_(self, **changes) -> "OverlapConfig":
        return replace(self, **changes)


MEGATRON_DEFAULTS = OverlapConfig()
# Narayanan et al. 2021's code: nothing overlapped, scatter/gather p2p (Sec. 4.1)
MEGATRON_2021 = OverlapConfig(overlap_p2p_comm=False, async_tp_backward=False, scatter_gather_p2p=True)
# DeepSpeed's pipeline engine (Megatron-DeepSpeed): synchronous p2p, no backward TP overlap
DEEPSPEED_PIPE = OverlapConfig(async_tp_backward=False, blocking_p2p=True)
# what recent performance recipes turn on (Megatron-LM README, "Performance Benchmarking")
MEGATRON_TUNED = OverlapConfig(overlap_grad_reduce=True, overlap_param_gather=True, tp_comm_overlap=True)

# Megatron DDP bucket size: max(40M, 1M * DP) parameters (distributed/distributed_data_parallel.py);
# the last bucket's reduction cannot hide behind any backward compute.
DDP_BUCKET_PARAMS = 40_000_000


def exposed_after(comm: float, hiding: float, floor: float = 0.0) -> float:
    """Time of ``comm`` that compute of length ``hiding`` cannot cover, at least ``floor``."""
    return max(comm - hiding, floor, 0.0)

"""Context parallelism (chapter "Context parallelism"): the sequence split over c ranks, attention
exchanging keys and values.

    merge.py                 attention over one K/V block, the online-softmax merge (pure math)
    sharding.py              which tokens a rank holds: load-balanced (chunks r, 2c-1-r) or contiguous
    blockwise.py             a rank's query chunks against one K/V block (causal chunk rule, work counted)
    cp_comm.py               the ring's batched send/recv step; Ulysses' all-to-all pair
    ring_attention.py        cp_comm_type "p2p": ring forward, hand-written backward ring
    allgather_attention.py   cp_comm_type "all_gather": all-gather K/V (Llama 3)
    a2a_attention.py         cp_comm_type "a2a": all-to-all heads <-> sequence (DeepSpeed-Ulysses)
    plan.py                  apply_context_parallel: swap core_attention, the batch transform
"""

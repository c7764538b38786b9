"""Expert parallelism (chapter "Expert parallelism"): each ep rank keeps num_experts / ep experts
of every MoE layer (labkit/moe.py) and tokens travel to them.

    ep_comm.py    the all-to-all and gather-v / reduce-scatter-v autograd pairs
    router.py     the router under sequence parallelism (counts summed over tp)
    dispatch.py   permutation + all-to-all (or all-gather) + inverse permutation
    plan.py       apply_expert_parallel: keep E/ep experts, swap the dispatcher by name
    metrics.py    Megatron's MoE log values of an iteration (load_balancing_loss, ...)
"""

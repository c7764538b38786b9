"""What the Expert-parallelism lab's checks share: what they ban, and the router's choices."""
from __future__ import annotations

OWN_PERMUTE = ("labkit.moe:permute", "labkit.moe:unpermute", "labkit.moe:row_weights",
               "labkit.moe:LocalDispatcher.forward")
EPC = "labkit.expert_parallel.ep_comm"
OWN_A2A = (f"{EPC}:all_to_all_autograd", f"{EPC}:_AllToAll.forward", "labkit.comm:all_to_all",
           "labkit.expert_parallel.dispatch:AllToAllDispatcher.forward",
           "labkit.expert_parallel.dispatch:AllToAllDispatcher.split_sizes")


def routing(num_tokens: int, num_experts: int, k: int, seed: int):
    """Router weights [T, E] (softmax over the top k, zero elsewhere) and the routing map [T, E]."""
    import torch
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(num_tokens, num_experts, generator=gen, dtype=torch.float64)
    top = logits.topk(k, dim=1)
    routing_map = torch.zeros_like(logits, dtype=torch.bool).scatter(1, top.indices, True)
    probs = torch.zeros_like(logits).scatter(1, top.indices, torch.softmax(top.values, -1))
    return probs, routing_map

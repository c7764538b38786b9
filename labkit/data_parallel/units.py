"""The units of ZeRO-2/3 by units (fsdp.py): the parameters of a layer (or the embedding, or the head)
in one flat buffer, sharded over dp, and the cut of a model chunk into such units, in forward order.

Chapter "Memory knobs". Each unit's buffer is padded to a multiple of dp (``ShardLayout``); dp rank r
owns chunk r, and the parameters are views of the buffer, so a gather into it restores them all.
"""
from __future__ import annotations

import torch

from .. import comm
from ..groups import Group
from .shard_layout import ShardLayout


class Unit:
    """Some parameters in one flat buffer, sharded over dp; ``users``: modules whose forward needs them."""

    def __init__(self, index: int, name: str, named, users, group: Group, keep_params: bool):
        self.index, self.name, self.users = index, name, users
        self.names, self.params = [n for n, _ in named], [p for _, p in named]
        self.layout = ShardLayout([p.numel() for p in self.params], group.size)
        self.lo, self.hi = self.layout.shard_range(group.rank)
        self.flat = self.params[0].new_zeros(self.layout.padded_numel)
        self.layout.bind(self.params, self.flat)                  # param.data: views of the flat buffer
        with torch.no_grad():
            self.flat.copy_(comm.broadcast(group, self.flat, src=0))   # rank 0's weights
        self.full_bytes = self.flat.untyped_storage().nbytes()
        shard = self.flat[self.lo:self.hi]
        self.shard = torch.nn.Parameter(shard if keep_params else shard.clone())
        self.grad_shard = torch.zeros_like(self.shard)
        self.work, self.grads_done = None, set()

    @property
    def gathered(self) -> bool:
        return self.flat.untyped_storage().nbytes() > 0


def units_of(chunks, named, group: Group, keep_params: bool, split=None) -> list[Unit]:
    """One unit per transformer layer, one for the embedding (and a tied output layer), one for
    the rest (the head), in forward order; any other module is one unit. ``split(param)``: those
    params get a unit of their own first ("layer 0 fp8": fp8_gather.py)."""
    owner = {id(p): n for n, p in named}
    groups: dict[str, list] = {}
    users: dict[str, list] = {}
    for chunk in chunks:
        layers = getattr(getattr(chunk, "decoder", None), "layers", None)
        parts = ([("embedding", chunk.embedding)] if getattr(chunk, "embedding", None) is not None else [])
        parts += [(f"layer {k}", m) for k, m in (layers.items() if layers is not None else [])]
        if layers is None:
            parts = [("model", chunk)]
        for key, module in parts:
            groups.setdefault(key, []).extend((owner[id(p)], p) for p in module.parameters() if id(p) in owner)
            users.setdefault(key, []).append(module)
        head = [m for m in (getattr(getattr(chunk, "decoder", None), "final_layernorm", None),
                            getattr(chunk, "output_layer", None)) if m is not None]
        if layers is not None and head:
            groups.setdefault("head", []).extend((owner[id(p)], p) for m in head for p in m.parameters()
                                                  if id(p) in owner)
            users.setdefault("head", []).extend(head)
            if chunk.output_layer is not None and chunk.output_layer.weight is None and "embedding" in users:
                users["embedding"].append(chunk.output_layer)      # tied: the logits read the embedding
    seen, out = set(), []
    for key, params in groups.items():
        params = [(n, p) for n, p in params if id(p) not in seen and not seen.add(id(p))]
        for k, part in ([(key + " fp8", [x for x in params if split(x[1])]),
                         (key, [x for x in params if not split(x[1])])] if split else [(key, params)]):
            if part:
                out.append(Unit(len(out), k, part, users[key], group, keep_params))
    return out

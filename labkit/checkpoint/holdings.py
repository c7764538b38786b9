"""What a rank holds, named in the dense model: the weights, and whatever its optimizer keeps.

Chapter "When training goes wrong". Nothing here knows a strategy: it reads the Engine's shard plan
(``engine.plan``: per parameter, its dense name and blocks) and asks each data-parallel member
(``engine.dp.members``) what its optimizer updates. An optimizer parameter is either a model
parameter (plain DP) or a flat run of several (ZeRO / Megatron's distributed optimizer: the shard
[lo, hi) of one flat buffer); :func:`runs` maps it to [(dense name, lo, hi, base)] element runs.
Each DP class says which with its ``checkpoint_views()`` (the interface
``labkit.data_parallel.member.DataParallelMember``, which every DP class derives from): the
checkpoint needs nothing else, and refuses an object that does not derive from it.
Mixed precision (bf16 / fp16): the fp32 masters are saved as the weights; a load fills the masters
and the 16-bit parameters from them (rounded as the step rounds them); the main_grad buffer is
transient (zero between iterations) and not saved.

Keys of a checkpoint (each a dense tensor, saved in pieces at their global offsets):

    model.NAME                 the values the optimizer updates (the weights; fp32 masters if kept)
    optimizer.KEY.NAME         every per-element state the optimizer holds (AdamW: exp_avg,
                               exp_avg_sq), found in ``optimizer.state``, not listed by hand
    optimizer.step             the step count (one value: every parameter steps together)
    optimizer.grad_scaler      fp16's dynamic loss scale: scale, growth and hysteresis trackers
                               (Megatron keeps them in the optimizer's state dict)
    rng.rankR                  the rank's RNG states (torch's default generator, the dropout streams)
    fp8.rankR                  FP8 delayed scaling: {dense module name: {role: (amax history,
                               scale)}} of the rank's linears (equal on the ranks that reduce
                               their amaxes together, so any layout can take its modules' own)

Who writes what (each dense value exactly once): only blocks a rank owns (``Block.owner``); with
plain DP only data-parallel rank 0 (``dp_index == 0``); under ZeRO each data-parallel rank its shard.
"""
from __future__ import annotations

import math

import torch

from ..data_parallel.member import DataParallelMember
from ..precision import DynamicGradScaler
from ..tensor_parallel.random import dropout_regions
from .boxes import boxes
from .dcp_io import Chunks


def runs(member) -> dict[int, list[tuple[str, int, int, int]]]:
    """{id(optimizer parameter): [(dense name, lo, hi, base)]}: its elements [base, base + hi - lo)
    hold the elements [lo, hi) of that parameter's local (flattened) tensor. Asked of the member
    (``DataParallelMember.checkpoint_views``); any other object is refused, naming its class."""
    if not isinstance(member, DataParallelMember):
        raise TypeError(f"checkpoint: {type(member).__name__} is not a data-parallel class labkit knows "
                        f"how to save: derive it from labkit.data_parallel.member.DataParallelMember and "
                        f"define checkpoint_views() and grads_sharded")
    return member.checkpoint_views()


def optimizer_params(member) -> list:
    return [p for group in member.optimizer.param_groups for p in group["params"]]


def _mapped(member):
    """[(optimizer parameter, its runs)], refusing a parameter the member does not describe."""
    table, out = runs(member), []
    for p in optimizer_params(member):
        if id(p) not in table:
            raise ValueError(f"checkpoint: {type(member).__name__}'s optimizer holds a tensor of shape "
                             f"{tuple(p.shape)} that no parameter maps to; give the DP class a "
                             f"checkpoint_views() that lists it (labkit/data_parallel/member.py)")
        out.append((p, table[id(p)]))
    return out


def _add(chunks: dict, key: str, entry, flat, lo, hi, base, owned_only: bool) -> None:
    for b in boxes(entry, lo, hi, owned_only):
        start = b.at - lo + base
        t = flat[start:start + math.prod(b.local)].view(b.local)
        if b.narrow is not None:
            t = t.narrow(*b.narrow)
        chunks.setdefault(f"{key}.{entry.name}", Chunks(entry.shape)).add(b.offsets, t)


def _per_element(value, param) -> bool:
    """A state with one value per element of ``param`` (a moment), not a scalar (the step)."""
    return torch.is_tensor(value) and value.dim() > 0 and value.numel() == param.numel()


def tensor_state(engine, for_load: bool = False) -> dict:
    """{checkpoint key: Chunks} of this rank. To save (``for_load=False``): the pieces it owns.
    To load: every piece it needs (all its blocks), as views of its parameters, of its optimizer's
    parameters when they are separate storage (ZeRO-3's shard, master weights) and of the states."""
    plan, out = engine.plan, {}
    for member in engine.dp.members:
        mapped = _mapped(member)                       # (refuses a member that is no DP class)
        sharded = member.grads_sharded
        model_storage = {p.untyped_storage().data_ptr() for p in member.params}
        if for_load:                                   # the weights, whole, wherever they live
            for name, p in zip(member.names, member.params):
                if p.untyped_storage().nbytes():       # (ZeRO-3: freed between uses)
                    _add(out, "model", plan[name], p.detach().view(-1), 0, p.numel(), 0, False)
        for opt_p, mapping in mapped:
            state = member.optimizer.state.get(opt_p, {})
            values = {"model": opt_p.detach()} if not for_load or \
                opt_p.untyped_storage().data_ptr() not in model_storage else {}
            values.update({f"optimizer.{k}": v for k, v in state.items()
                           if _per_element(v, opt_p)})
            for key, tensor in values.items():
                for name, lo, hi, base in mapping:
                    entry = plan[name]
                    if not for_load and not sharded and entry.dp_index != 0:
                        continue                       # plain DP: replicas; dp rank 0 writes
                    _add(out, key, entry, tensor.view(-1), lo, hi, base, not for_load)
    return out


def state_keys(engine) -> list[str]:
    """The per-element optimizer state names this rank's optimizers hold (AdamW: exp_avg, exp_avg_sq)."""
    keys = set()
    for member in engine.dp.members:
        for p in optimizer_params(member):
            keys |= {k for k, v in member.optimizer.state.get(p, {}).items()
                     if _per_element(v, p)}
    return sorted(keys)


def step_value(engine):
    """The optimizer's step count (a tensor, as AdamW keeps it), or None before the first step."""
    for member in engine.dp.members:
        for p in optimizer_params(member):
            step = member.optimizer.state.get(p, {}).get("step")
            if step is not None:
                return step.detach().cpu().clone() if torch.is_tensor(step) else step
    return None


def create_state(engine, keys, step) -> None:
    """Give every optimizer parameter the states ``keys`` (zeros, to be loaded into) and ``step``:
    AdamW creates its state at the first step, a resumed run needs it before."""
    for member in engine.dp.members:
        for p in optimizer_params(member):
            st = member.optimizer.state[p]
            for k in keys:
                st[k] = torch.zeros_like(p, memory_format=torch.preserve_format)
            if step is not None:
                st["step"] = step.clone() if torch.is_tensor(step) else step


# -- fp16's dynamic loss scale (labkit.precision.DynamicGradScaler; a constant one is configuration) --
SCALER_FIELDS = ("scale", "_growth_tracker", "_hysteresis_tracker")


def scaler_state(engine) -> dict | None:
    """{field: value} of the Engine's dynamic loss scaler, or None (no scaler, or a constant one)."""
    s = engine.scaler
    return {k: getattr(s, k) for k in SCALER_FIELDS} if isinstance(s, DynamicGradScaler) else None


def set_scaler_state(engine, state: dict) -> bool:
    """Restore a saved dynamic loss scale into the Engine's; False if this run has none to restore."""
    if scaler_state(engine) is None:
        return False
    for k in SCALER_FIELDS:
        setattr(engine.scaler, k, state[k])
    return True


# -- FP8 delayed scaling (labkit.fp8.linear): each linear's amax histories and scales ------------------
def _fp8_modules(engine) -> dict:
    """{dense module name: LinearFP8} of this rank's linears that keep delayed-scaling state."""
    out = {}
    for chunk in engine.runner.chunks:
        for name, m in chunk.named_modules():
            fp8 = getattr(m, "fp8", None)
            if getattr(fp8, "delayed", None) is not None:
                entry = engine.plan.get(f"{name}.weight")
                out[entry.name.removesuffix(".weight") if entry is not None else name] = fp8
    return out


def fp8_state(engine) -> dict | None:
    """{dense module name: {role: (history, scale)}}, or None without delayed scaling."""
    mods = _fp8_modules(engine)
    return {n: {r: (d.history.clone(), d.scale.clone()) for r, d in f.delayed.items()}
            for n, f in mods.items()} or None


def set_fp8_state(engine, state: dict) -> int:
    """Restore every delayed-scaling history and scale of this rank from ``state``; returns how
    many linears. KeyError naming a linear the checkpoint does not hold."""
    mods = _fp8_modules(engine)
    for n, f in mods.items():
        if n not in state:
            raise KeyError(f"checkpoint: no FP8 delayed-scaling state for {n!r}")
        for r, d in f.delayed.items():
            d.history, d.scale = (t.clone() for t in state[n][r])
    return len(mods)


# -- RNG: torch's default generator and the dropout streams (labkit/tensor_parallel/random.py) ----
def streams(engine) -> dict[str, torch.Generator]:
    """{region: generator} of this rank's Dropout modules ("default", "model_parallel")."""
    sp = engine.cfg.sequence_parallel and engine.groups["tp"].size > 1
    out = {}
    for chunk in engine.runner.chunks:
        for name, region in dropout_regions(chunk, sp).items():
            gen = chunk.get_submodule(name).generator
            if gen is not None:
                out.setdefault(region, gen)
    return out


def rng_state(engine) -> dict:
    return {"torch": torch.get_rng_state(), **{k: g.get_state() for k, g in streams(engine).items()}}


def set_rng_state(engine, state: dict) -> None:
    torch.set_rng_state(state["torch"])
    for k, g in streams(engine).items():
        if k in state:
            g.set_state(state[k])

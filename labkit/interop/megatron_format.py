"""Megatron-Core's ``torch_dist`` checkpoint layout, written from and read into labkit's dense weights.

Chapter "Weights that travel". labkit's dense names and fused layouts are Megatron-Core's own (its
local spec, ``get_gpt_layer_local_spec``): fused QKV rows per query group [q heads | k | v], SwiGLU's
fc1 as [gate; up]. What ``dist_checkpointing`` adds, read from Megatron-LM at commit d98e8a64
(github.com/NVIDIA/Megatron-LM/tree/d98e8a64ddf34856e74b24714e3bedb2f5a39553):

* **Layers are stacked.** ``TransformerBlock.sharded_state_dict`` (transformer_block.py, l. 826-846)
  renames ``decoder.layers.3.X`` to ``decoder.layers.X`` with a leading axis of ``num_layers``
  (sharded offset (0, layer, num_layers)): one tensor [L, ...] per parameter, whatever PP cut it.
  Layers that differ (``moe_layer_freq`` other than 1, l. 799-803) keep ``decoder.layers.3.X``.
* **Experts are stacked too.** ``SequentialMLP.sharded_state_dict`` (moe/experts.py, l. 1526-1556)
  renames ``mlp.experts.local_experts.e.X`` to ``mlp.experts.experts.X`` with an expert axis of
  ``num_experts`` after the layer axis: [L, E, ...], whatever EP cut it.
* **TP leaves the global tensor as the dense one.** A column-parallel weight's shard sits at its rank's
  offset, so the global QKV is per group [q | k | v] (groups are cut whole); SwiGLU's fc1 is stored as
  two pieces per rank at offsets r and t + r of 2t (``apply_swiglu_sharded_factory``, mlp.py
  l. 427-497), so the global fc1 is [gate; up] for any TP. The vocabulary is the padded one.
* **Tied output layers are not stored** (language_module.py l. 436-507: the last stage's copy points
  at ``embedding.word_embeddings.weight``).
* **Files**: DCP's ``.metadata`` and ``__R_I.distcp``; ``metadata.json`` = {"sharded_backend":
  "torch_dist", "sharded_backend_version": 1, "common_backend": "torch", "common_backend_version": 1}
  (core.py ``CheckpointingConfig``; d98e8a64 dropped the two common_* fields and ignores them when
  read); the common (non-tensor) state in ``common.pt``, which megatron-core 0.16.1 requires and
  d98e8a64 still reads first (serialization.py l. 193-229; it writes the newer "common_state"
  ShardedObject instead, which :func:`read_megatron` reads too); Megatron's tree
  ``latest_checkpointed_iteration.txt`` + ``iter_0000000/``. Not written: the linears'
  ``_extra_state`` objects (None without Transformer Engine / FP8): drop them from the sharded state
  dict you load with, as tests/test_interop_megatron.py does.

* **Layer norms take the name of the linear they precede**, in the local spec too:
  ``get_gpt_layer_local_spec`` (models/gpt/gpt_layer_specs.py, l. 459-462) maps ``input_layernorm.``
  to ``self_attention.linear_qkv.layer_norm_`` and ``pre_mlp_layernorm.`` to
  ``mlp.linear_fc1.layer_norm_`` (MoE layers included), so its checkpoints load into the Transformer
  Engine spec, whose linears hold the norm. (The TE spec's MoE layers keep ``pre_mlp_layernorm`` and
  store experts as TEGroupedMLP's ``weight0..E-1``: not written here.)
"""
from __future__ import annotations

import io
import json
import math
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp

from .hf_names import one_process

EXPERT, COMMON = "mlp.experts.local_experts.", "common_state/shard_0_1"
METADATA = {"sharded_backend": "torch_dist", "sharded_backend_version": 1, "common_backend": "torch",
            "common_backend_version": 1}
FUSED_NORMS = {"input_layernorm.": "self_attention.linear_qkv.layer_norm_",
               "pre_mlp_layernorm.": "mlp.linear_fc1.layer_norm_"}


def homogeneous(cfg) -> bool:
    """Megatron stacks the layers when they are all alike (no MoE, or every layer MoE)."""
    return cfg.num_experts is None or cfg.moe_layer_freq == 1


def key_of(name: str, cfg) -> tuple[str, tuple]:
    """(Megatron key, index into it) of labkit's dense ``name``: ``decoder.layers.3.mlp.experts.
    local_experts.5.linear_fc1.weight`` -> (``decoder.layers.mlp.experts.experts.linear_fc1.weight``, (3, 5))."""
    if not name.startswith("decoder.layers."):
        return name, ()
    layer, sub = name.removeprefix("decoder.layers.").split(".", 1)
    index = (int(layer),) if homogeneous(cfg) else ()
    prefix = "decoder.layers." if homogeneous(cfg) else f"decoder.layers.{layer}."
    if sub.startswith(EXPERT):
        e, rest = sub.removeprefix(EXPERT).split(".", 1)
        sub, index = "mlp.experts.experts." + rest, index + (int(e),)
    for norm, fused in FUSED_NORMS.items():
        if sub.startswith(norm):
            sub = fused + sub.removeprefix(norm)
    return prefix + sub, index


def to_megatron(state: dict, cfg) -> dict:
    """labkit's dense state dict -> {Megatron key: global tensor} (stacked over layers and experts)."""
    groups: dict[str, dict] = {}
    for name, t in state.items():
        key, index = key_of(name, cfg)
        groups.setdefault(key, {})[index] = t
    out = {}
    for key, parts in groups.items():
        if list(parts) == [()]:
            out[key] = parts[()]
            continue
        shape = tuple(max(i[a] for i in parts) + 1 for a in range(len(next(iter(parts)))))
        if len(parts) != len(torch.empty(shape, device="meta").view(-1)):
            raise ValueError(f"{key}: pieces {sorted(parts)} do not fill {shape}")
        first = next(iter(parts.values()))
        out[key] = torch.stack([parts[i] for i in sorted(parts)]).reshape(*shape, *first.shape)
    return out


def from_megatron(tensors: dict, cfg) -> dict:
    """{Megatron key: global tensor} -> labkit's dense state dict (every tensor used, all of it)."""
    from ..model import GPT
    with torch.device("meta"):
        names = [n for n, _ in GPT(cfg).named_parameters()]
    out, where = {}, {}
    for name in names:
        key, index = key_of(name, cfg)
        if key not in tensors:
            raise ValueError(f"the Megatron checkpoint has no {key!r} (for labkit's {name})")
        out[name] = tensors[key][index] if index else tensors[key]
        where.setdefault(key, []).append(index)
    if set(tensors) - set(where):
        raise ValueError(f"Megatron tensors with no place in labkit's model: {sorted(set(tensors) - set(where))[:3]}")
    for key, indices in where.items():   # a stacked tensor holds exactly labkit's layers / experts
        if len(indices) != math.prod(tensors[key].shape[:len(indices[0])]):
            raise ValueError(f"{key}: global shape {tuple(tensors[key].shape)} holds more than labkit's model")
    return out


def import_megatron(folder, cfg=None) -> tuple:
    """(model spec, labkit dense state dict) of a torch_dist checkpoint; the spec from the common
    state labkit wrote, or ``cfg`` (a GPTConfig) for a checkpoint Megatron wrote."""
    from ..spec import GPTConfig
    tensors, common = read_megatron(folder)
    if cfg is None:
        if "labkit_model" not in common:
            raise ValueError(f"{folder}: written by Megatron itself; pass cfg (labkit.spec.GPTConfig)")
        fields = dict(common["labkit_model"])
        if isinstance(fields.get("moe_layer_freq"), list):
            fields["moe_layer_freq"] = tuple(fields["moe_layer_freq"])
        cfg = GPTConfig(**fields)
    return cfg, from_megatron(tensors, cfg)


def export_megatron(state: dict, cfg, save, iteration: int = 0) -> dict:
    """Write Megatron's tree ``save/latest_checkpointed_iteration.txt`` + ``save/iter_0000000/``
    (DCP files, metadata.json, common.pt). Returns {"files": {name: bytes}}."""
    folder = Path(save) / f"iter_{iteration:07d}"
    folder.mkdir(parents=True, exist_ok=False)
    out = {k: v.detach().contiguous() for k, v in to_megatron(state, cfg).items()}
    common = {"checkpoint_version": 3.0, "iteration": iteration,
              "labkit_model": {k: (list(v) if isinstance(v, tuple) else v) for k, v in vars(cfg).items()}}
    with one_process():
        dcp.save(out, storage_writer=dcp.FileSystemWriter(str(folder)), no_dist=True)
    torch.save(common, folder / "common.pt")
    (folder / "metadata.json").write_text(json.dumps(METADATA))
    (Path(save) / "latest_checkpointed_iteration.txt").write_text(str(iteration))
    return {"files": {p.name: p.stat().st_size for p in sorted(folder.iterdir()) if p.is_file()}}


def read_megatron(folder) -> tuple[dict, dict]:
    """({Megatron key: global tensor}, the common state) of an ``iter_*`` folder (or its parent)."""
    folder = Path(folder)
    if (folder / "latest_checkpointed_iteration.txt").is_file():
        folder = folder / f"iter_{int((folder / 'latest_checkpointed_iteration.txt').read_text()):07d}"
    config = json.loads((folder / "metadata.json").read_text())
    if config.get("sharded_backend") != "torch_dist":
        raise ValueError(f"{folder}: sharded_backend {config.get('sharded_backend')!r}, not torch_dist")
    meta = dcp.FileSystemReader(str(folder)).read_metadata()
    tensors = {k: torch.empty(md.size, dtype=md.properties.dtype)
               for k, md in meta.state_dict_metadata.items() if hasattr(md, "size")}
    if (folder / "common.pt").is_file():
        common = torch.load(folder / "common.pt", weights_only=True)
    else:
        tensors[COMMON] = io.BytesIO()
    with one_process():
        dcp.load(tensors, storage_reader=dcp.FileSystemReader(str(folder)), no_dist=True)
    if COMMON in tensors:
        buf = tensors.pop(COMMON)
        buf.seek(0)
        common = torch.load(buf, weights_only=True)[0]
    return tensors, common

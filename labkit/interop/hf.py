"""A Hugging Face model folder out of labkit's dense weights, and back.

Chapter "Weights that travel". The folder is what ``transformers``' ``save_pretrained`` writes and
``from_pretrained`` reads (offline, from a path):

    config.json                         the architecture (hf_config.py)
    model.safetensors                   every tensor by its Hugging Face name (hf_names.py), or, above
    model-0000k-of-0000K.safetensors    ``max_shard_bytes``, shards with
    model.safetensors.index.json        {"metadata": {"total_size"}, "weight_map": {name: file}}

``safetensors`` is the only package needed (``requirements-interop.txt``); ``transformers`` is needed
only to check the result. Tensors are written in the dtype they have (float64 included).
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from ..spec import GPTConfig
from .hf_config import gpt_config, hf_config
from .hf_names import from_hf, to_hf

SINGLE, INDEX = "model.safetensors", "model.safetensors.index.json"


def _safetensors():
    try:
        import safetensors.torch as st
    except ImportError as e:   # pragma: no cover - exercised where the pin is not installed
        raise ImportError("labkit.interop needs safetensors: pip install -r requirements-interop.txt") from e
    return st


def shards(tensors: dict, max_shard_bytes: int | None) -> list[dict]:
    """Tensors in order, cut into consecutive groups of at most ``max_shard_bytes`` each (a tensor
    larger than the limit gets a shard of its own), as ``save_pretrained(max_shard_size=...)``."""
    groups, size = [{}], 0
    for name, t in tensors.items():
        nbytes = t.numel() * t.element_size()
        if max_shard_bytes and groups[-1] and size + nbytes > max_shard_bytes:
            groups.append({})
            size = 0
        groups[-1][name] = t
        size += nbytes
    return groups


def export_hf(state: dict, cfg: GPTConfig, folder, max_shard_bytes: int | None = 5 * 2**30) -> dict:
    """Write labkit's dense ``state`` (model of ``cfg``) as a Hugging Face folder. Returns
    {"files": {name: bytes}, "family": ...}."""
    st, folder = _safetensors(), Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().cpu().contiguous().clone() for k, v in sorted(to_hf(state, cfg).items())}
    dtypes = {str(t.dtype).removeprefix("torch.") for t in tensors.values()}
    if len(dtypes) != 1:
        raise ValueError(f"a checkpoint in one dtype, please: found {sorted(dtypes)}")
    config = hf_config(cfg, dtype=dtypes.pop())
    (folder / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    for old in [*folder.glob("model*.safetensors"), folder / INDEX]:
        old.unlink(missing_ok=True)                      # a previous export's shards
    groups = shards(tensors, max_shard_bytes)
    if len(groups) == 1:
        st.save_file(tensors, str(folder / SINGLE), metadata={"format": "pt"})
    else:
        weight_map = {}
        for k, group in enumerate(groups, 1):
            name = f"model-{k:05d}-of-{len(groups):05d}.safetensors"
            st.save_file(group, str(folder / name), metadata={"format": "pt"})
            weight_map.update({t: name for t in group})
        total = sum(t.numel() * t.element_size() for t in tensors.values())
        index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
        (folder / INDEX).write_text(json.dumps(index, indent=2) + "\n")
    return {"family": config["model_type"],
            "files": {p.name: p.stat().st_size for p in sorted(folder.iterdir()) if p.is_file()}}


def read_hf_tensors(folder) -> dict:
    """{HF name: tensor} of a folder's ``model.safetensors`` or its indexed shards."""
    st, folder = _safetensors(), Path(folder)
    if (folder / INDEX).is_file():
        weight_map = json.loads((folder / INDEX).read_text())["weight_map"]
        out = {}
        for name in sorted(set(weight_map.values())):
            out.update(st.load_file(str(folder / name)))
        missing = set(weight_map) - set(out)
        if missing:
            raise ValueError(f"{folder / INDEX} names tensors no shard holds: {sorted(missing)[:3]}")
        return out
    if not (folder / SINGLE).is_file():
        raise ValueError(f"{folder}: no {SINGLE} or {INDEX} (is it a Hugging Face model folder?)")
    return st.load_file(str(folder / SINGLE))


def import_hf(folder) -> tuple[GPTConfig, dict]:
    """(labkit model spec, labkit dense state dict) of a Hugging Face folder of GPT-2, Llama or
    Mixtral (ValueError with the reason for anything labkit does not compute)."""
    folder = Path(folder)
    cfg = gpt_config(json.loads((folder / "config.json").read_text()))
    return cfg, from_hf(read_hf_tensors(folder), cfg)


def load_state(model: torch.nn.Module, state: dict) -> None:
    """Copy a dense state dict into labkit's dense ``GPT`` (names and shapes must all match)."""
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ValueError(f"state dict does not fit the model: missing {missing[:3]}, unexpected {unexpected[:3]}")

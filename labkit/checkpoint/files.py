"""A checkpoint directory on disk, and the checks that refuse a bad one before any rank starts.

Megatron-LM's layout (``megatron/training/checkpointing.py``): one folder per saved iteration and
a tracker file naming the latest complete one, written last:

    SAVE/latest_checkpointed_iteration.txt   "4"
    SAVE/iter_0000004/.metadata              DCP: every tensor's global shape and saved pieces
    SAVE/iter_0000004/__R_0.distcp           the pieces rank R wrote
    SAVE/iter_0000004/labkit.json            iteration, data position, configuration, layout
    SAVE/iter_0000004/manifest.json          every file's size and sha256 (written by rank 0 last)

A save writes into ``iter_0000004.partial`` and renames it only when every rank has written and
every file is hashed; the tracker moves after the rename. A save killed halfway leaves a
``.partial`` folder and the tracker on the previous checkpoint, which still loads.
:func:`verify` refuses, naming the file and the reason, a folder that is not a finished checkpoint,
a truncated or corrupt file, or a checkpoint of another model. Pure Python (hashlib, json), except
reading DCP's ``.metadata``.
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from ..spec import MODEL_FIELDS, field_default  # noqa: F401 - the spec's one list of the model's fields

TRACKER = "latest_checkpointed_iteration.txt"
INFO, MANIFEST, METADATA = "labkit.json", "manifest.json", ".metadata"
FORMAT = "labkit-dcp-1"


def iteration_dir(save: str | os.PathLike, iteration: int) -> Path:
    return Path(save) / f"iter_{iteration:07d}"


def sha256(path: Path, block: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(block):
            h.update(chunk)
    return h.hexdigest()


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` so that a reader sees the old content or the new, never half."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_manifest(folder: Path) -> dict:
    """{file: {"bytes", "sha256"}} of every file in ``folder`` (the manifest itself excluded)."""
    files = {p.name: {"bytes": p.stat().st_size, "sha256": sha256(p)}
             for p in sorted(folder.iterdir()) if p.is_file() and p.name != MANIFEST}
    write_atomic(folder / MANIFEST, json.dumps(files, indent=1, sort_keys=True))
    return files


@dataclass(frozen=True)
class Found:
    """A verified checkpoint: its folder, iteration and ``labkit.json`` content."""

    path: Path
    iteration: int
    info: dict


def find(load: str | os.PathLike) -> Path | None:
    """The folder of the latest finished checkpoint under ``load`` (the tracker's), ``load`` itself
    if it is one, or None if ``load`` holds no checkpoint at all (Megatron then starts afresh)."""
    load = Path(load)
    if (load / TRACKER).is_file():
        text = (load / TRACKER).read_text().strip()
        if not text.isdigit():
            raise ValueError(f"{load / TRACKER}: corrupt tracker, expected an iteration number, got {text[:40]!r}")
        return iteration_dir(load, int(text))
    if (load / INFO).is_file() or (load / METADATA).is_file() or load.name.endswith(".partial"):
        return load
    return None


def verify(path: str | os.PathLike, cfg=None) -> Found:
    """Check the checkpoint folder ``path`` (from :func:`find`); with ``cfg`` (a TrainConfig) also
    that it holds this model. ValueError naming the file and the reason."""
    path = Path(path)
    if not path.is_dir():
        raise ValueError(f"{path}: no such checkpoint folder (the tracker names it; was it deleted?)")
    if path.name.endswith(".partial") or not (path / MANIFEST).is_file():
        raise ValueError(f"{path}: unfinished checkpoint (no {MANIFEST}): its save was interrupted; "
                         f"load the folder above it to get the latest finished one")
    try:
        manifest = json.loads((path / MANIFEST).read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path / MANIFEST}: corrupt ({e})") from None
    for name, want in manifest.items():
        f = path / name
        if not f.is_file():
            raise ValueError(f"{f}: missing (the manifest lists it, {want['bytes']} bytes)")
        size = f.stat().st_size
        if size != want["bytes"]:
            raise ValueError(f"{f}: truncated or grown: {size} bytes, the manifest says {want['bytes']}")
        if sha256(f) != want["sha256"]:
            raise ValueError(f"{f}: corrupt: its sha256 differs from the manifest's (same size, other bytes)")
    info = json.loads((path / INFO).read_text())
    if info.get("format") != FORMAT:
        raise ValueError(f"{path / INFO}: format {info.get('format')!r}, this labkit reads {FORMAT!r}")
    if cfg is not None:
        check_compatible(info, cfg, path / INFO)
    return Found(path, int(info["iteration"]), info)


def model_fields(cfg) -> dict:
    """The fields of :data:`MODEL_FIELDS` of a TrainConfig's model (vocabulary padded as the run pads it)."""
    model = cfg.model_config()
    return {k: getattr(model, k) for k in MODEL_FIELDS}


def check_compatible(info: dict, cfg, where) -> None:
    """ValueError listing every model field that differs between the checkpoint and ``cfg``."""
    here, saved = model_fields(cfg), info["model"]
    # a field the checkpoint does not hold was added to the spec after it was written: its default
    old = {k: saved.get(k, field_default(k)) for k in here}
    diff = [f"{k} {old[k]!r} in the checkpoint, {v!r} here" for k, v in here.items() if _norm(old[k]) != _norm(v)]
    if diff:
        hint = (" (the vocabulary is padded to a multiple of make_vocab_size_divisible_by x TP: pick "
                "make_vocab_size_divisible_by so both layouts pad alike)" if any("vocab_size" in d for d in diff) else "")
        raise ValueError(f"{where}: incompatible checkpoint, another model: {'; '.join(diff)}{hint}")


def _norm(value):
    return list(value) if isinstance(value, tuple) else value


def read_metadata(path: Path):
    """DCP's metadata of a checkpoint folder (a corrupt ``.metadata`` is named)."""
    from torch.distributed.checkpoint import FileSystemReader
    try:
        return FileSystemReader(str(path)).read_metadata()
    except Exception as e:  # noqa: BLE001 - any unpickling error means the same thing here
        raise ValueError(f"{path / METADATA}: corrupt or unreadable DCP metadata ({type(e).__name__}: {e})") from None

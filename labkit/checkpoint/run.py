"""The checkpoint arguments of ``labkit.train``: checked in the caller, acted on in every rank.

    ckpt = check_arguments(cfg, steps, save, save_interval, load, async_save)   # before launch
    start, saver = resume(ckpt, engine, cfg, topo, seed)                        # in each rank

``check_arguments`` refuses bad values and a bad checkpoint (unfinished, truncated, corrupt, of
another model) before any process starts, naming the file and the reason (``files.verify``). A
``load`` folder with no checkpoint at all starts from scratch, as Megatron-LM does (so ``load`` and
``save`` may name the same folder from the first run on).
"""
from __future__ import annotations

import sys

from ..validate import positive_int
from . import files


def check_arguments(cfg, steps: int, save, save_interval, load, async_save) -> dict:
    """{"save", "save_interval", "async_save", "load": files.Found or None}; ValueError if wrong."""
    positive_int("save_interval", save_interval, allow_none=True, note=" (iterations)")
    if save_interval is not None and save is None:
        raise ValueError(f"save_interval {save_interval} without save: name the folder to save into")
    if not isinstance(async_save, bool):
        raise ValueError(f"async_save must be True or False, got {async_save!r}")
    found = None
    if load is not None:
        path = files.find(load)
        if path is None:
            print(f"labkit.train: no checkpoint in {load} (no {files.TRACKER}): starting from "
                  f"iteration 0", file=sys.stderr)
        else:
            found = files.verify(path, cfg)
            files.read_metadata(found.path)
            if found.iteration >= steps:
                raise ValueError(f"{found.path}: the checkpoint is at iteration {found.iteration} and steps is "
                                 f"{steps}: nothing to train (steps counts iterations in total, as Megatron's "
                                 f"--train-iters)")
    return {"save": None if save is None else str(save), "save_interval": save_interval,
            "async_save": async_save, "load": found}


def resume(ckpt: dict | None, engine, cfg, topo, seed: int):
    """In a rank: load the checkpoint if any, make the Saver if asked. Returns (first iteration,
    Saver or None)."""
    if not ckpt:
        return 0, None
    start, saver = 0, None
    if ckpt["load"] is not None:
        from .saver import load_into
        start = load_into(engine, ckpt["load"], cfg, topo)["iteration"]
    if ckpt["save"] is not None:
        from .saver import Saver
        saver = Saver(ckpt["save"], engine, cfg, topo, seed, ckpt["async_save"])
    return start, saver

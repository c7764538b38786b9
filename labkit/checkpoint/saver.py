"""Save a training run's state from every rank, in the background if asked; load it into any layout.

Chapter "When training goes wrong". Megatron-LM's flags: ``save`` (folder), ``save_interval``
(iterations), ``load`` (folder), ``async_save`` (``--async-save``: write while training goes on).

    saver = Saver(save, engine, cfg, topo, seed, async_save=True)    # on every rank
    saver.save(iteration)        # blocks only to copy the state to host memory ("staging")
    saver.finish()               # waits for the last write (end of training)

A save, on every rank: stage (a CPU copy of the pieces the rank owns, ``holdings.tensor_state``),
then write through ``torch.distributed.checkpoint`` into ``iter_N.partial`` on a gloo process group
of its own (so the background writer's collectives never interleave with training's), hash the
files it wrote, and meet the others; rank 0 then writes ``labkit.json`` and the manifest, renames
the folder and moves the tracker (``files.py``). Only one save is in flight: the next one waits.

A load (:func:`load_into`) reads, on each rank alone (DCP ``no_dist``: no collective), the global
boxes its own layout needs: another TP/PP/VPP/DP/ZeRO/CP/EP layout and world size load the same
files. The RNG states are restored only on the same layout (the dropout streams are per (pp, tp)
rank); the data position is the iteration (labkit's batch of iteration i depends only on i). Mixed
precision: the fp32 masters are the weights (the 16-bit parameters are loaded from them), and
fp16's dynamic loss scale is restored when the loading run has one (Megatron's ``grad_scaler``), as
are FP8 delayed scaling's amax histories and scales (so a resumed FP8 run is the uninterrupted one).
"""
from __future__ import annotations

import json
import shutil
import threading
import time
from dataclasses import asdict
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from . import files, holdings
from .dcp_io import Chunks, PiecesLoadPlanner, PiecesSavePlanner


def layout_of(cfg, topo) -> dict:
    """What must match for the RNG states to mean the same thing after a load."""
    return {"world_size": topo.world_size, "tp": topo.tp, "pp": topo.pp, "cp": topo.cp, "ep": topo.ep,
            "vpp": cfg.virtual_pipeline_size(), "sequence_parallel": cfg.sequence_parallel,
            "schedule": cfg.schedule_name() if topo.pp > 1 else None}


class Saver:
    """Checkpoints of one rank's Engine; every rank makes one, at the same point (a collective)."""

    def __init__(self, save, engine, cfg, topo, seed: int, async_save: bool = False):
        self.save_dir, self.engine, self.cfg, self.topo, self.seed = Path(save), engine, cfg, topo, seed
        self.async_save = async_save
        self.rank = dist.get_rank()
        from ..groups import subgroup_kwargs
        self.pg = dist.new_group(backend="gloo", **subgroup_kwargs()) if dist.get_world_size() > 1 else None
        self.thread, self.error = None, None
        self.fault = None               # labkit.restart: called with the iteration once the files are written
        self.timings: list[dict] = []   # per save: iteration, blocking_s, write_s, bytes (this rank)

    def save(self, iteration: int, consumed_samples: int) -> None:
        self.wait()
        t0 = time.perf_counter()
        state = {k: v.staged() for k, v in holdings.tensor_state(self.engine).items()}
        state[f"rng.rank{self.rank}"] = holdings.rng_state(self.engine)
        scaler = holdings.scaler_state(self.engine)        # fp16's dynamic loss scale, or None
        fp8 = holdings.fp8_state(self.engine)              # FP8 delayed scaling's state, or None
        if fp8 is not None:
            state[f"fp8.rank{self.rank}"] = fp8
        if self.rank == 0:
            state["optimizer.step"] = holdings.step_value(self.engine)
            if scaler is not None:
                state["optimizer.grad_scaler"] = scaler
        record = {"iteration": iteration, "bytes": sum(v.nbytes for v in state.values() if isinstance(v, Chunks)),
                  "async": self.async_save}
        info = dict(self._info(iteration, consumed_samples), grad_scaler=scaler is not None,
                    fp8_state=fp8 is not None)
        if self.async_save:
            self.thread = threading.Thread(target=self._write_guarded, args=(state, info, record),
                                           name=f"labkit-save-{iteration}", daemon=True)
            self.thread.start()
        else:
            self._write(state, info, record)
        record["blocking_s"] = time.perf_counter() - t0
        self.timings.append(record)

    def wait(self) -> None:
        """Wait for the save in flight; re-raise its error here, in the training thread."""
        if self.thread is not None:
            self.thread.join()
            self.thread = None
        if self.error is not None:
            err, self.error = self.error, None
            raise RuntimeError(f"rank {self.rank}: background checkpoint save failed") from err

    def finish(self) -> list[dict]:
        self.wait()
        return self.timings

    # -- the write (in a background thread when async) -------------------------------------------
    def _write_guarded(self, state, info, record) -> None:
        try:
            self._write(state, info, record)
        except BaseException as e:  # noqa: BLE001 - handed to the training thread by wait()
            self.error = e

    def _barrier(self) -> None:
        if self.pg is not None:
            dist.barrier(group=self.pg)

    def _write(self, state, info, record) -> None:
        t0 = time.perf_counter()
        final = files.iteration_dir(self.save_dir, info["iteration"])
        partial = final.with_name(final.name + ".partial")
        if self.rank == 0:
            shutil.rmtree(partial, ignore_errors=True)     # a folder left by an interrupted save
            partial.mkdir(parents=True)
        self._barrier()
        dcp.save(state, storage_writer=dcp.FileSystemWriter(str(partial)), planner=PiecesSavePlanner(),
                 process_group=self.pg, no_dist=self.pg is None)
        if self.fault is not None:                         # a kill during a save, on purpose
            self.fault(info["iteration"])
        self._barrier()                                    # every rank's files are complete
        if self.rank == 0:
            files.write_atomic(partial / files.INFO, json.dumps(info, indent=1, sort_keys=True, default=str))
            files.write_manifest(partial)
            shutil.rmtree(final, ignore_errors=True)       # the same iteration saved again
            partial.rename(final)
            files.write_atomic(self.save_dir / files.TRACKER, str(info["iteration"]))
        self._barrier()
        record["write_s"] = time.perf_counter() - t0

    def _info(self, iteration: int, consumed_samples: int) -> dict:
        return {"format": files.FORMAT, "iteration": iteration, "consumed_samples": consumed_samples,
                "seed": self.seed, "model": files.model_fields(self.cfg), "layout": layout_of(self.cfg, self.topo),
                "config": asdict(self.cfg), "optimizer_states": holdings.state_keys(self.engine),
                "torch": torch.__version__}


def load_into(engine, found: files.Found, cfg, topo) -> dict:
    """Load the verified checkpoint ``found`` into this rank's Engine (any layout). Returns what
    was restored: {"iteration", "consumed_samples", "rng": "restored" | "reseeded"}."""
    keys = found.info["optimizer_states"]
    holdings.create_state(engine, keys, None)
    state = holdings.tensor_state(engine, for_load=True)
    state["optimizer.step"] = None
    same_layout = found.info["layout"] == layout_of(cfg, topo)
    rank = dist.get_rank()
    if same_layout:
        state[f"rng.rank{rank}"] = None
    scaler = found.info.get("grad_scaler", False) and holdings.scaler_state(engine) is not None
    if scaler:                                   # fp16's dynamic loss scale, saved and wanted
        state["optimizer.grad_scaler"] = None
    fp8 = found.info.get("fp8_state", False) and holdings.fp8_state(engine) is not None
    # every saving rank's linears (any layout); a converted checkpoint (interop) has no ranks
    saved_ranks = range(found.info["layout"]["world_size"]) if fp8 else ()
    for r in saved_ranks:
        state[f"fp8.rank{r}"] = None
    planner = PiecesLoadPlanner(where=str(found.path))
    dcp.load(state, storage_reader=dcp.FileSystemReader(str(found.path)), planner=planner, no_dist=True)
    step = planner.objects["optimizer.step"]
    if step is not None:
        holdings.create_state(engine, [], step)
    if same_layout:
        holdings.set_rng_state(engine, planner.objects[f"rng.rank{rank}"])
    if scaler:
        holdings.set_scaler_state(engine, planner.objects["optimizer.grad_scaler"])
    if fp8:                                      # this rank's own entries win (the same layout)
        merged = {}
        for r in [*(r for r in saved_ranks if r != rank), rank]:
            merged.update(planner.objects.get(f"fp8.rank{r}") or {})
        holdings.set_fp8_state(engine, merged)
    return {"iteration": found.iteration, "consumed_samples": found.info["consumed_samples"],
            "rng": "restored" if same_layout else "reseeded", "grad_scaler": "restored" if scaler else None}

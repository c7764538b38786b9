"""Measured envelopes: how far a correct parallel run drifts from the one-device run of the same
precision (chapter "Low precision"; ``python -m labkit.drift envelopes``).

For each family (:data:`labkit.drift.layouts.FAMILIES`), precision and seed: ``labkit.train`` on the
family's layout and on one device, same model, batch, seed and precision (passed through), then
per step the relative differences of the loss and of the gradient norm, and after step 1 the
relative L2 difference of all gradients. The band is the largest difference over seeds up to each
step; the derived bound (``bounds.derived_band``) is written beside it.
"""
from __future__ import annotations

import datetime
import math
import platform
import subprocess
import time

from .bounds import derived_band, precision_kwargs, precision_name, probabilistic_band, reordered_terms, unit_roundoff
from .layouts import FAMILIES, MODEL, one_device


def rel(a: float, b: float) -> float:
    """|a - b| / |b| (0 where both are 0; inf where only b is)."""
    if a == b:
        return 0.0
    return abs(a - b) / abs(b) if b != 0 else math.inf


def grads_rel(a: dict, b: dict) -> float:
    """||a - b||_2 / ||b||_2 over every gradient (dense names), in float64."""
    num = sum(float((a[n].double() - g.double()).pow(2).sum()) for n, g in b.items())
    den = sum(float(g.double().pow(2).sum()) for g in b.values())
    return math.sqrt(num / den) if den else (0.0 if num == 0 else math.inf)


def run(world_size: int, kwargs: dict, precision, seed: int, steps: int, bug: str | None = None,
        timeout: float = 600.0) -> dict:
    """One ``labkit.train`` run: {"losses", "grad_norms", "grads" (after step 1)}; ``bug``: a name of
    ``labkit.debug.BUGS`` planted on every rank."""
    import labkit
    probe = None
    if bug is not None:
        from ..debug.bugs import Plant
        probe = Plant(bug)
    res = labkit.train(world_size=world_size, steps=steps, seed=seed, log_interval=0, capture_grads=True,
                       timeout=timeout, probe=probe, **kwargs, **precision_kwargs(precision))
    return {"losses": list(res.losses), "grad_norms": list(res.grad_norms), "grads": res.grads}


def differences(par: dict, one: dict) -> dict:
    """Per step, the relative loss and grad-norm differences; after step 1, the gradients'."""
    return {"loss": [rel(a, b) for a, b in zip(par["losses"], one["losses"])],
            "grad_norm": [rel(a, b) for a, b in zip(par["grad_norms"], one["grad_norms"])],
            "grads_step1": grads_rel(par["grads"], one["grads"])}


def running_max(curves: list) -> list:
    """Per step, the largest value of any curve at that step or before (a band that never narrows)."""
    out, top = [], 0.0
    for k in range(min(len(c) for c in curves)):
        top = max(top, *(c[k] for c in curves))
        out.append(top)
    return out


def band(pairs: list) -> dict:
    return {"loss": running_max([p["loss"] for p in pairs]),
            "grad_norm": running_max([p["grad_norm"] for p in pairs]),
            "grads_step1": max(p["grads_step1"] for p in pairs)}


def family_cell(family: str, precision, seeds, steps: int, cache: dict, log=print) -> dict:
    """The envelope of one family x precision: pairs per seed, band, derived bounds, inside?"""
    world, layout, model = FAMILIES[family]
    kw = {**MODEL, **model, **layout}
    u = unit_roundoff(precision)
    n = reordered_terms(kw["global_batch_size"] // kw["micro_batch_size"], world)
    pairs = []
    for seed in seeds:
        t0 = time.perf_counter()
        key = (repr(sorted(one_device(kw).items())), precision_name(precision), seed)
        if key not in cache:
            cache[key] = run(1, one_device(kw), precision, seed, steps)
        par = run(world, kw, precision, seed, steps)
        pairs.append({"seed": seed, **differences(par, cache[key])})
        log(f"{family:9s} {precision_name(precision):5s} seed {seed}: max loss drift "
            f"{max(pairs[-1]['loss']):.2e} ({time.perf_counter() - t0:.1f} s)")
    b = band(pairs)
    derived = derived_band(steps, u, n)
    cell = {"world_size": world, "layout": layout, "model": model, "u": u, "n": n, "pairs": pairs, "band": b,
            "derived": derived, "probabilistic": probabilistic_band(steps, u, n)}
    cell["inside"] = None if derived is None else bool(
        all(x <= d for x, d in zip(b["loss"], derived)) and all(x <= d for x, d in zip(b["grad_norm"], derived))
        and b["grads_step1"] <= derived[0])
    return cell


def provenance(command: str, seeds, steps: int) -> dict:
    import torch
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                                cwd=__file__.rsplit("/labkit/", 1)[0], timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        commit = None
    return {"command": command, "labkit_commit": commit,
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "machine": f"{platform.machine()} {platform.processor() or ''} {platform.system()}, "
                       f"torch {torch.__version__}, CPU, gloo".replace("  ", " "),
            "seeds": list(seeds), "steps": steps, "model": MODEL}


def envelopes(families=None, precisions=("fp32", "bf16", "fp16"), seeds=(0, 1, 2), steps: int = 20,
              command: str = "", log=print, save=None) -> dict:
    """The whole table: {"provenance", "cells": {family: {precision name: cell}}}, cells that fail
    recorded with their error (a layout a precision refuses). ``save(table)``: called after each
    cell (a run stopped early keeps what it measured)."""
    cache, cells = {}, {}
    t0 = time.perf_counter()
    out = {"provenance": provenance(command, seeds, steps), "cells": cells}
    for family in families or list(FAMILIES):
        for precision in precisions:
            name = precision_name(precision)
            try:
                cells.setdefault(family, {})[name] = family_cell(family, precision, seeds, steps, cache, log)
            except (ValueError, RuntimeError) as e:
                cells.setdefault(family, {})[name] = {"error": str(e).splitlines()[0]}
                log(f"{family} {name}: {cells[family][name]['error']}")
            cells[family][name]["precision"] = precision_kwargs(precision)
            out["provenance"]["seconds"] = round(time.perf_counter() - t0, 1)
            if save is not None:
                save(out)
    return out


def merge(tables: list) -> dict:
    """One table from several (each family x precision from the first table that has it); the
    provenance lists each part's."""
    cells = {}
    for t in tables:
        for fam, by_prec in t["cells"].items():
            for prec, cell in by_prec.items():
                cells.setdefault(fam, {}).setdefault(prec, cell)
    return {"provenance": {"parts": [t["provenance"] for t in tables]}, "cells": cells}

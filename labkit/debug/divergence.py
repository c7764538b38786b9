"""``first_divergence``: where a parallel run first differs from one device, and which collective.

Chapter "When training goes wrong". Megatron-Bridge ships a tool that finds the first point where
two runs diverge; this one runs on a laptop because labkit has an exact float64 reference:

    d = labkit.debug.first_divergence(4, tensor_model_parallel_size=2, sequence_parallel=True,
                                      inject="sp_norm_grads_not_summed")
    print(d)     # iteration 0, grads, decoder.layers.0, ...input_layernorm.weight; all_reduce on tp
    python -m labkit diverge --world-size 4 --tensor-model-parallel-size 2 --sequence-parallel \
        --inject sp_norm_grads_not_summed

Three runs: the single-device reference with its fingerprints (``fingerprints.ReferenceRecording``),
the run under test with its fingerprints and collectives (``fingerprints.Recording``, the planted
bug applied), and, to name the collective, a clean run of the same layout (``compare`` says how).
Float64 and no dropout: the reference and the run then agree to round-off, so any difference is a bug.
"""
from __future__ import annotations

import time

from .bugs import BUGS, MODEL, resolve
from .compare import Divergence, first_divergence_of  # noqa: F401 - Divergence: the result type


def _config(layout: dict) -> dict:
    cfg = {"params_dtype": "float64", **layout}
    for name in ("hidden_dropout", "attention_dropout"):
        if cfg.get(name, 0.0):
            raise ValueError(f"{name} {cfg[name]}: the first divergence is found against one device, whose "
                             f"dropout masks differ from a parallel run's; set it to 0")
    if cfg["params_dtype"] != "float64":
        raise ValueError(f"params_dtype {cfg['params_dtype']!r}: the first divergence needs float64 (round-off "
                         f"of float32 is larger than the bugs it looks for)")
    return cfg


def reference(world_size: int, steps: int = 1, seed: int = 0, **layout) -> dict:
    """The single-device fingerprints of ``layout``'s model and data (``ReferenceRecording``)."""
    from labkit.reference import train_reference

    from .fingerprints import ReferenceRecording
    return train_reference(world_size=world_size, steps=steps, seed=seed, probe=ReferenceRecording,
                           **_config(layout))["probe"]


def record(world_size: int, inject: str | None = None, steps: int = 1, seed: int = 0,
           timeout: float = 300.0, **layout) -> list[dict]:
    """Every rank's fingerprints and collectives of one run of ``layout`` (``Recording``)."""
    import labkit

    from .fingerprints import Recording
    run = labkit.train(world_size=world_size, steps=steps, seed=seed, log_interval=0, timeout=timeout,
                       probe=Recording(resolve(inject)), **_config(layout))
    return [r["probe"] for r in run.ranks]


def first_divergence(world_size: int, inject: str | None = None, steps: int = 1, seed: int = 0,
                     compare_collectives: bool | None = None, timeout: float = 300.0,
                     against: list | None = None, **layout):
    """The first place a run of ``layout`` on ``world_size`` ranks differs from one device
    (:class:`~labkit.debug.compare.Divergence`), or None. ``inject``: a planted bug of
    :data:`~labkit.debug.bugs.BUGS` (or a lab's assignment token). ``compare_collectives``: also
    run a clean run of the same layout to name the collective (default: when a bug is injected);
    ``against``: a clean run already recorded (:func:`record`) to use instead. The result's
    ``seconds`` is the tool's wall time."""
    t0 = time.perf_counter()
    bug, config = resolve(inject), _config(layout)
    ref = reference(world_size, steps, seed, **config)
    ranks = record(world_size, bug, steps, seed, timeout, **config)
    clean = against
    if clean is None and (compare_collectives if compare_collectives is not None else bug is not None):
        clean = record(world_size, None, steps, seed, timeout, **config)
    from labkit.config import train_config
    found = first_divergence_of(ranks, ref, train_config(**config).num_layers, clean)
    if found is not None:
        found.seconds = time.perf_counter() - t0
    return found


def divergence_table(names=None, **overrides) -> list[dict]:
    """Run every planted bug (or ``names``) and tabulate where it was found and in how long:
    [{"bug", "layout", "found at", "collective", "expected", "seconds"}]."""
    rows = []
    for name in names or sorted(BUGS):
        bug = BUGS[name]
        t0 = time.perf_counter()
        d = first_divergence(inject=name, **{**bug.kwargs(), **overrides})
        rows.append({"bug": name, "ranks": bug.world_size,
                     "layout": ", ".join(f"{k}={v}" for k, v in bug.layout.items()) or "dp=2",
                     "found at": None if d is None else f"it {d.iteration}, {d.phase}"
                     + (f", mb {d.microbatch}" if d.microbatch is not None else "") + f", {d.layer}, {d.tensor}",
                     "collective": None if d is None else d.collective_name,
                     "expected": f"{bug.expect['layer']} / {bug.expect['collective']}",
                     "seconds": time.perf_counter() - t0})
    return rows


__all__ = ["first_divergence", "reference", "record", "divergence_table", "Divergence", "BUGS", "MODEL"]

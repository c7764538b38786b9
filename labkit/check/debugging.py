"""Checks for the lab "When training goes wrong": a planted bug, a reshard by hand, a hang report.

``planted_bug(answer, seed)``: ``answer = {"layer": ..., "collective": ...}`` for the bug
``labkit.debug.assignment(seed)`` planted; compared with where that bug acts
(``labkit.debug.BUGS[name].expect``, which tests/test_debug_bugs.py proves the tool finds), never
with text the notebook printed.

``reshard(student_fn)``: ``student_fn(shards, ffn) -> shards`` turns the TP2 pieces of a SwiGLU
``linear_fc1`` (dense [2 ffn, h] = [gate; up]; TP rank r holds [gate_r; up_r]) and of its two Adam
moments into the TP4 pieces: ``shards`` is [{"weight", "exp_avg", "exp_avg_sq"}] per TP2 rank, the
result the same per TP4 rank. Compared exactly with the dense tensors cut by index arithmetic
written out here, for two shapes, while ``labkit.shard_plan``'s cut/assemble are disabled.

``hang_diagnosis(answer, seed)``: ``answer = {"waits": {0: op, 1: op}, "culprit": rank}`` for the
hang ``run_assigned_hang(seed)`` ran: the collective each rank waits in, and the rank whose code
lacks the call its peer waits for. Compared with the scenario's own definition.
"""
from __future__ import annotations

import random

from . import forbidden, report
from .legacy import hint

HANGS = [("skipped_collective", 0), ("skipped_collective", 1), ("send_without_recv", 0), ("send_without_recv", 1)]
WAITS = {"skipped_collective": "all_reduce", "send_without_recv": "send"}   # what the other rank waits in


def _norm(value) -> str | None:
    if value is None:
        return None
    text = str(value).strip().lower().replace("-", "_")
    return None if text in ("", "none") else " ".join(text.split())


def planted_bug(answer: dict, seed: int):
    from labkit.debug.bugs import assigned_bug
    name, bug = "planted_bug", assigned_bug(seed)
    want = bug.expect
    got = answer if isinstance(answer, dict) else {}
    layer, coll = _norm(got.get("layer")), _norm(got.get("collective"))
    if layer != want["layer"]:
        return report(name, False, f"layer {got.get('layer')!r} is not where this bug first shows", hint(
            name, planted_bug, ["run first_divergence(**assignment(SEED)) and read the layer on its first line",
                                "the layer is the divergence's .layer (\"embedding\", \"decoder.layers.N\", ...)"],
            kind="layer"))
    if coll != _norm(want["collective"]):
        return report(name, False, f"collective {got.get('collective')!r}: the layer is right, the collective not",
                      hint(name, planted_bug, ["read the line 'collective: OP on GROUP #N': answer \"OP on GROUP\"",
                                               "the divergence's .collective_name; None when it names no collective"],
                           kind="collective"))
    return report(name, True, f"{want['layer']}, {want['collective'] or 'no collective'}: the planted bug was "
                              f"{bug.name} ({bug.doc})")


# -- reshard ---------------------------------------------------------------------------------------
def _cut_fc1(dense, ffn: int, tp: int) -> list:
    """[gate_r; up_r] of each of ``tp`` ranks, by index arithmetic (Megatron's SwiGLU cut)."""
    import torch
    n = ffn // tp
    return [torch.cat([dense[r * n:(r + 1) * n], dense[ffn + r * n:ffn + (r + 1) * n]]).clone() for r in range(tp)]


def reshard(student_fn):
    import torch
    name = "reshard"
    for ffn, h in ((8, 4), (12, 3)):
        gen = torch.Generator().manual_seed(ffn)
        dense = {k: torch.randn(2 * ffn, h, generator=gen, dtype=torch.float64) for k in ("weight", "exp_avg", "exp_avg_sq")}
        dense["exp_avg_sq"] = dense["exp_avg_sq"].abs()
        tp2 = [{k: _cut_fc1(dense[k], ffn, 2)[r] for k in dense} for r in range(2)]
        want = [{k: _cut_fc1(dense[k], ffn, 4)[r] for k in dense} for r in range(4)]
        with forbidden("labkit.shard_plan:cut", "labkit.shard_plan:assemble", "labkit.shard_plan:stacked",
                       why="write the reshard with index arithmetic yourself"):
            try:
                got = student_fn([dict(s) for s in tp2], ffn)
            except Exception as e:  # noqa: BLE001 - the student's error is the message
                return report(name, False, f"ffn {ffn}: raised {type(e).__name__}: {e}",
                              "start from the dense [gate; up]: put the two TP2 pieces back together first")
        if not isinstance(got, (list, tuple)) or len(got) != 4:
            return report(name, False, f"ffn {ffn}: expected a list of 4 pieces (TP4 ranks), got {type(got).__name__}"
                          f"{' of ' + str(len(got)) if isinstance(got, (list, tuple)) else ''}", "one dict per TP4 rank")
        for r, (g, w) in enumerate(zip(got, want)):
            for k in w:
                t = g.get(k) if isinstance(g, dict) else None
                if t is None or tuple(t.shape) != tuple(w[k].shape) or not torch.equal(t.to(w[k].dtype), w[k]):
                    shape = None if t is None else tuple(t.shape)
                    return report(name, False, f"ffn {ffn}, TP4 rank {r}, {k}: shape {shape}, expected "
                                  f"{tuple(w[k].shape)}{'' if shape != tuple(w[k].shape) else ', other values'}",
                                  hint(name, student_fn, [
                                      "TP4 rank r holds gate rows [r f/4, (r+1) f/4) then up rows f + the same",
                                      "rebuild gate = cat of each TP2 piece's first f/2 rows, up = of its last f/2",
                                      "the moments are cut exactly like the weight: same rows, same order"]))
    return report(name, True, "TP2 -> TP4 of a SwiGLU fc1 and both Adam moments, two shapes, exact")


# -- hang ------------------------------------------------------------------------------------------
def hang_assignment(seed: int) -> tuple[str, int]:
    return HANGS[random.Random(seed).randrange(len(HANGS))]


def run_assigned_hang(seed: int, timeout: float = 3.0):
    """Run the hang of ``seed`` (its name hidden) and return its ``Outcome``."""
    from labkit.debug.hangs import run_hang
    scenario, culprit = hang_assignment(seed)
    out = run_hang(scenario, timeout=timeout, culprit=culprit)
    out.name = f"assigned-{seed}"
    return out


def hang_diagnosis(answer: dict, seed: int):
    name = "hang_diagnosis"
    scenario, culprit = hang_assignment(seed)
    want = {culprit: "barrier", 1 - culprit: WAITS[scenario]}
    got = answer if isinstance(answer, dict) else {}
    waits = {int(k): _norm(v) for k, v in (got.get("waits") or {}).items()}
    if waits != want:
        return report(name, False, f"waits {got.get('waits')!r} is not where the ranks wait",
                      hint(name, hang_diagnosis, ["each line 'rank R waits in OP (...)' of the report gives one",
                                                  "answer the op names as printed: all_reduce, send, barrier"],
                           kind="waits"))
    if got.get("culprit") != culprit:
        return report(name, False, f"culprit {got.get('culprit')!r}: the waits are right, the rank at fault not",
                      hint(name, hang_diagnosis, ["the rank at fault never issued what its peer waits for",
                                                  "it went past: it waits in the launcher's final barrier"],
                           kind="culprit"))
    return report(name, True, f"rank {1 - culprit} waits in {want[1 - culprit]}, which rank {culprit} never "
                              f"issued ({scenario.replace('_', ' ')})")

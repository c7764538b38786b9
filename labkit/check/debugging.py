"""Checks for the lab "When training goes wrong": a planted bug, a reshard by hand, a hang report.

Three Specs (:mod:`labkit.check.spec`); ``SEED`` is the student's (the instructor gives one per
student: it chooses the bug and the hang), read from the answer cells with the answer, and named
in every verdict so that an instructor can compare it with the seed handed out.

``planted-bug``: ``answer = {"layer": ..., "collective": ...}`` for the bug
``labkit.debug.assignment(SEED)`` planted; judged against where that bug acts
(``labkit.debug.BUGS[name].expect``, which tests/test_debug_bugs.py proves the tool finds), never
against text the notebook printed. The answer is read off one run for one seed: no hidden case.

``reshard``: ``reshard_tp2_to_tp4(shards, ffn) -> shards`` turns the TP2 pieces of a SwiGLU
``linear_fc1`` (dense [2 ffn, h] = [gate; up]; TP rank r holds [gate_r; up_r]) and of its two Adam
moments into the TP4 pieces: ``shards`` is [{"weight", "exp_avg", "exp_avg_sq"}] per TP2 rank, the
result the same per TP4 rank. ``produce`` calls it while ``labkit.shard_plan``'s cut/assemble are
disabled; ``judge`` compares exactly with the dense tensors cut by index arithmetic written out
here. Visible: two shapes; hidden: other shapes and values (``solutions/hidden/``).

``hang``: ``diagnosis = {"waits": {0: op, 1: op}, "culprit": rank}`` for the hang
``run_assigned_hang(SEED)`` ran: the collective each rank waits in, and the rank whose code lacks
the call its peer waits for. Judged against the scenario's own definition; no hidden case.
"""
from __future__ import annotations

import random

from . import describe_mismatch, report
from .hints import asker
from .spec import Spec, call, failed, run
from .compare import number, same
from .stragglers import STRAGGLER, name_the_straggler, straggler_record  # noqa: F401 - the lab's fourth exercise

HANGS = [("skipped_collective", 0), ("skipped_collective", 1), ("send_without_recv", 0), ("send_without_recv", 1)]
WAITS = {"skipped_collective": "all_reduce", "send_without_recv": "send"}   # what the other rank waits in
OWN_CUT = ("labkit.shard_plan:cut", "labkit.shard_plan:assemble", "labkit.shard_plan:stacked")
KEYS = ("weight", "exp_avg", "exp_avg_sq")


def _norm(value) -> str | None:
    if value is None:
        return None
    text = str(value).strip().lower().replace("-", "_")
    return None if text in ("", "none") else " ".join(text.split())


def _text(value) -> str | None:
    """A student's answer value as plain data: None, or its text (at most 200 characters)."""
    return None if value is None else str(value)[:200]


def _seed(value):
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _not_a_dict(what: str, value, keys: str) -> dict:
    return {"failed": "invalid", "detail": f"{what} is a {type(value).__name__}, not a dict with {keys}"}


# -- planted bug ------------------------------------------------------------------------------------
def _produce_bug(student):
    got = student.load()
    answer = got["answer"]
    if not isinstance(answer, dict):
        return _not_a_dict("answer", answer, '"layer" and "collective"')
    return {"seed": _seed(got["seed"]), "layer": _text(answer.get("layer")),
            "collective": _text(answer.get("collective"))}


def _judge_bug(data):
    from labkit.debug.bugs import assigned_bug
    name = "planted_bug"
    bad = failed(name, data, 'answer = {"layer": "...", "collective": "..."} (two strings, or None)')
    if bad is not None:
        return bad
    if number(data["seed"], integer=True) is None:
        return report(name, False, "SEED is not a whole number", "keep SEED = the number your instructor gave you")
    seed = f"seed {data['seed']}: "
    bug = assigned_bug(data["seed"])
    want = bug.expect
    if _norm(data["layer"]) != want["layer"]:
        return report(name, False, f"{seed}layer {data['layer']!r} is not where this bug first shows",
                      "the layer is on the first line the tool prints: 'first divergence: iteration I, PHASE, "
                      "microbatch M, LAYER, TENSOR'")
    if _norm(data["collective"]) != _norm(want["collective"]):
        return report(name, False, f"{seed}collective {data['collective']!r}: the layer is right, the collective not",
                      "read the line 'collective: OP on GROUP #N (...)' and answer \"OP on GROUP\"; None when "
                      "the tool names no collective")
    return report(name, True, f"{seed}{want['layer']}, {want['collective'] or 'no collective'}: "
                              f"the planted bug was {bug.name} ({bug.doc})")


PLANTED_BUG = Spec("planted-bug", {"answer": "answer", "seed": "SEED"}, _produce_bug, _judge_bug, cases=({},),
                   hints=("run first_divergence(**assignment(SEED)) and read its first line: the layer is the "
                          "name after the microbatch (\"embedding\", \"decoder.layers.N\", ...)",
                          "the collective is the line 'collective: OP on GROUP #N': answer \"OP on GROUP\"",
                          "the tool's result has them as attributes: d.layer and d.collective_name"))


def planted_bug(answer: dict, seed: int):
    """Is ``answer`` where the bug of ``seed`` first shows? Prints one [check] line."""
    return run(PLANTED_BUG, {"answer": answer, "seed": seed})


# -- reshard ---------------------------------------------------------------------------------------
def _cut_fc1(dense, ffn: int, tp: int) -> list:
    """[gate_r; up_r] of each of ``tp`` ranks, by index arithmetic (Megatron's SwiGLU cut)."""
    import torch
    n = ffn // tp
    return [torch.cat([dense[r * n:(r + 1) * n], dense[ffn + r * n:ffn + (r + 1) * n]]).clone() for r in range(tp)]


def _dense(ffn: int, h: int, seed: int) -> dict:
    import torch
    gen = torch.Generator().manual_seed(1000 * seed + ffn)
    dense = {k: torch.randn(2 * ffn, h, generator=gen, dtype=torch.float64) for k in KEYS}
    dense["exp_avg_sq"] = dense["exp_avg_sq"].abs()
    return dense


def _plain_pieces(got):
    """What the student's function returned, as data: a list of dicts of tensors, or a description."""
    import torch
    if not isinstance(got, (list, tuple)):
        return f"a {type(got).__name__}"
    out = []
    for piece in got[:8]:
        if not isinstance(piece, dict):
            out.append(f"a {type(piece).__name__}")
            continue
        out.append({k: (piece[k].detach() if isinstance(piece[k], torch.Tensor) else f"a {type(piece[k]).__name__}")
                    for k in KEYS if k in piece})
    return out


def _produce_reshard(student, shapes=((8, 4), (12, 3)), seed=0):
    fn = student.load()["reshard"]
    out = []
    for ffn, h in shapes:
        dense = _dense(ffn, h, seed)
        tp2 = [{k: _cut_fc1(dense[k], ffn, 2)[r] for k in KEYS} for r in range(2)]
        with student.banning(OWN_CUT, "write the reshard with index arithmetic yourself"):
            got, failure = call(fn, tp2, ffn)
        if failure:
            return {**failure, "detail": f"ffn {ffn}: {failure['detail']}"} if failure["failed"] == "raised" else failure
        out.append(_plain_pieces(got))
    return out


def _judge_reshard(data, shapes=((8, 4), (12, 3)), seed=0):
    import torch
    name = f"reshard ({len(shapes)} shape{'s' * (len(shapes) > 1)})"
    bad = failed(name, data, "start from the dense [gate; up]: put the two TP2 pieces back together first")
    if bad is not None:
        return bad
    if type(data) is not list or len(data) != len(shapes):
        return report(name, False, f"expected a reshard for each of {len(shapes)} shapes, got "
                      f"{len(data) if type(data) is list else 'a ' + type(data).__name__}")
    for (ffn, h), got in zip(shapes, data):
        dense = _dense(ffn, h, seed)
        want = [{k: _cut_fc1(dense[k], ffn, 4)[r] for k in KEYS} for r in range(4)]
        if isinstance(got, str) or len(got) != 4:
            what = got if isinstance(got, str) else f"a list of {len(got)}"
            return report(name, False, f"ffn {ffn}: expected a list of 4 pieces (TP4 ranks), got {what}",
                          "one dict {\"weight\", \"exp_avg\", \"exp_avg_sq\"} per TP4 rank")
        for r, (g, w) in enumerate(zip(got, want)):
            for k in KEYS:
                t = g.get(k) if isinstance(g, dict) else None
                ok = isinstance(t, torch.Tensor) and tuple(t.shape) == tuple(w[k].shape) and torch.equal(
                    t.to(w[k].dtype), w[k])
                if not ok:
                    if isinstance(t, torch.Tensor) and tuple(t.shape) == tuple(w[k].shape):
                        what = describe_mismatch(t, w[k])
                    else:
                        shape = f"shape {tuple(t.shape)}" if isinstance(t, torch.Tensor) else f"got {t}"
                        what = f"{shape}, expected shape {tuple(w[k].shape)}"
                    return report(name, False, f"ffn {ffn}, h {h}, TP4 rank {r}, {k}: {what}",
                                  _reshard_diagnosis(t, w[k], dense[k], r))
    return report(name, True, f"TP2 -> TP4 of a SwiGLU fc1 and both Adam moments, ffn x h = "
                  f"{', '.join(f'{f} x {h}' for f, h in shapes)}: exact")


def _reshard_diagnosis(t, want, dense, r: int) -> str:
    """Which classic mistake the piece looks like."""
    import torch
    if isinstance(t, torch.Tensor) and tuple(t.shape) == tuple(want.shape):
        if torch.equal(t.to(want.dtype), dense.chunk(4)[r]):
            return ("that is rows [r 2f/4, (r+1) 2f/4) of the fused weight: a fused [gate; up] is not cut in "
                    "contiguous blocks; TP4 rank r holds gate rows [r f/4, (r+1) f/4) then the same rows of up")
        return "compare your piece with [gate_r; up_r]: gate rows [r f/4, (r+1) f/4), then up rows f + the same"
    return "each TP4 piece has f/2 rows: f/4 of gate, then f/4 of up"


RESHARD = Spec("reshard", {"reshard": "reshard_tp2_to_tp4"}, _produce_reshard, _judge_reshard,
               cases=({"shapes": [[8, 4], [12, 3]], "seed": 0},), forbid=OWN_CUT,
               why="write the reshard with index arithmetic yourself", hints=(
                   "start from the dense [gate; up]: gate = cat of each TP2 piece's first f/2 rows, up = cat "
                   "of their last f/2 rows",
                   "TP4 rank r holds gate rows [r f/4, (r+1) f/4) then up rows f + the same: "
                   "torch.cat([gate[r*n:(r+1)*n], up[r*n:(r+1)*n]]) with n = f/4",
                   "the moments are cut exactly like the weight: same rows, same order"))


def reshard(student_fn, shapes=((8, 4), (12, 3)), seed: int = 0):
    """TP2 -> TP4 of a SwiGLU fc1 and its Adam moments with ``student_fn``; prints one [check] line."""
    return run(RESHARD, {"reshard": student_fn}, shapes=[list(s) for s in shapes], seed=seed)


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


def _produce_hang(student):
    got = student.load()
    answer = got["diagnosis"]
    if not isinstance(answer, dict):
        return _not_a_dict("diagnosis", answer, '"waits" and "culprit"')
    waits = answer.get("waits")
    if not isinstance(waits, dict):
        return _not_a_dict('diagnosis["waits"]', waits, "one op per rank")
    culprit = answer.get("culprit")
    return {"seed": _seed(got["seed"]), "waits": {str(k)[:20]: _text(v) for k, v in list(waits.items())[:8]},
            "culprit": culprit if isinstance(culprit, int) and not isinstance(culprit, bool) else _text(culprit)}


def _judge_hang(data):
    name = "hang_diagnosis"
    bad = failed(name, data, 'diagnosis = {"waits": {0: "op", 1: "op"}, "culprit": rank}')
    if bad is not None:
        return bad
    if number(data["seed"], integer=True) is None:
        return report(name, False, "SEED is not a whole number", "keep SEED = the number your instructor gave you")
    seed = f"seed {data['seed']}: "
    scenario, culprit = hang_assignment(data["seed"])
    want = {culprit: "barrier", 1 - culprit: WAITS[scenario]}
    waits = {_seed(k): _norm(v) for k, v in data["waits"].items()}
    if waits != want:
        shown = {k: v for k, v in data["waits"].items()}
        return report(name, False, f"{seed}waits {shown!r} is not where the ranks wait",
                      "each line 'rank R waits in OP (...)' of the report gives one: answer the op as printed "
                      "(all_reduce, send, barrier), keyed by the rank number")
    if not same(data["culprit"], culprit):
        return report(name, False, f"{seed}culprit {data['culprit']!r}: the waits are right, the rank at fault not",
                      "the rank at fault never issued what its peer waits for: it went past, and waits in the "
                      "launcher's final barrier")
    return report(name, True, f"{seed}rank {1 - culprit} waits in {want[1 - culprit]}, which "
                              f"rank {culprit} never issued ({scenario.replace('_', ' ')})")


HANG = Spec("hang", {"diagnosis": "diagnosis", "seed": "SEED"}, _produce_hang, _judge_hang, cases=({},),
            hints=("each line 'rank R waits in OP (...)' of the report gives one entry of waits: {R: \"OP\"}",
                   "the rank at fault never issued the call its peer waits for",
                   "it went past that call, to the end of its function: it waits in the launcher's final barrier"))


def hang_diagnosis(answer: dict, seed: int):
    """Is ``answer`` the diagnosis of the hang of ``seed``? Prints one [check] line."""
    return run(HANG, {"diagnosis": answer, "seed": seed})


SPECS = {s.id: s for s in (PLANTED_BUG, RESHARD, HANG, STRAGGLER)}
hint = asker(SPECS)

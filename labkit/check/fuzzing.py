"""Checks for the lab "Finding the bug nobody chose": a layout sampler, a shrinker, a finding named.

Three Specs (:mod:`labkit.check.spec`); a layout here is the part of ``labkit.train``'s arguments the
fuzzer's axes draw, with Megatron's names, and the world size:

    {"world_size": 8, "tensor_model_parallel_size": 2, "context_parallel_size": 2,
     "pipeline_model_parallel_size": 1, "sequence_parallel": True}          (dp = 8 / (2 x 2 x 1))

It is valid for a model ``shape`` = {"world_size", "num_layers", "num_attention_heads", "seq_length"}
when (:func:`why_invalid`): tp x cp x pp divides the world size; tp divides the heads; pp divides the
layers; 2 cp divides the sequence (context parallelism's load-balanced halves); with sequence
parallelism, tp divides the s / cp positions of a CP rank: labkit's rule book
(``labkit.fuzz.refusal``) decides these the same way (tests/test_check_fuzzing.py compares them on
every layout of the cases' shapes). One rule is the lab's own: sequence parallelism only with tp > 1
(the rule book accepts SP at tp = 1, where it does nothing; the lab refuses it so that one layout
has one name).

``valid-layouts``: ``draw_layout(rng, shape) -> layout``, a sampler that draws only valid layouts and
can draw every one. ``produce`` calls it ``draws`` times with one ``random.Random(seed)``; ``judge``
enumerates the valid layouts itself and requires every draw valid and every valid layout drawn.
Hidden: other shapes (a world of 6 with 6 heads and 3 layers: no power of two to hard-code).

``shrink-layout``: ``shrink(layout, shape, still_fails) -> layout``, greedy shrinking: a layout that
still fails and none of whose one-step-simpler neighbours (:func:`neighbours`: dp, tp, cp or pp
reduced to a smaller divisor, sequence parallelism off) fails, within ``budget`` calls of
``still_fails``. The case's failure is data: {"needs": {axis: least size}, "sp": bool}, a bug that acts
when each named axis (``"dp"`` included) is at least that large (and SP is on, if asked), as the
composition bugs of ``labkit.debug.composition`` act. Hidden: other failures, start layouts, shapes.

``name-the-finding``: ``answer = "BUG NAME"`` for the fuzz table :func:`fuzz_table` gives for the
student's ``SEED`` (drawn layouts of ``labkit.fuzz``, each with the features the six planted
composition bugs depend on and whether the run diverged from one device), judged against the bug
that seed planted. The verdicts in the table come from where each bug acts
(``labkit.debug.composition.WHEN``; ``tests/test_fuzz_bugs.py`` proves a real run diverges exactly
there), so the table costs a second, not a fuzz run of minutes. No hidden case.
"""
from __future__ import annotations

import random

from . import report
from .hints import asker
from .fuzz_layouts import (AXES, CP, MAX_DRAWS, PP, SP, TP, _dp, _key, _name, _sizes, fails,  # noqa: F401
                           neighbours, valid_layouts, why_invalid)
from .spec import Spec, call, failed, failure, run

def _plain_layout(got, world: int | None = None):
    """A student's layout as exact plain data, or a description of what it is instead."""
    if not isinstance(got, dict):
        return f"a {type(got).__name__}, not a dict"
    keys = (TP, CP, PP, SP) + (("world_size",) if world is None else ())
    missing = [k for k in keys if k not in got]
    if missing:
        return f"a dict without {', '.join(missing)}"
    out = {"world_size": world if world is not None else got["world_size"]}
    for k in keys:
        v = got[k]
        if k == SP:
            if type(v) is not bool:
                return f"{SP} = {str(v)[:40]!r}, not True or False"
        elif type(v) is not int:
            return f"{k} = {str(v)[:40]!r}, not an int"
        out[k] = v
    return out


# -- valid layouts ------------------------------------------------------------------------------------
SHAPE = {"world_size": 8, "num_layers": 4, "num_attention_heads": 4, "seq_length": 16}


def _produce_sampler(student, shape=SHAPE, draws=2000, seed=0):
    fn = student.load()["draw"]
    rng, out = random.Random(seed), []
    for _ in range(min(int(draws), MAX_DRAWS)):
        got, bad = call(fn, rng, dict(shape))
        if bad:
            return bad
        lay = _plain_layout(got, shape["world_size"])
        if isinstance(lay, str):
            return failure("invalid", f"draw_layout returned {lay}")
        out.append([lay[TP], lay[CP], lay[PP], lay[SP]])
    return out


def _judge_sampler(data, shape=SHAPE, draws=2000, seed=0):
    name = f"draw_layout on world {shape['world_size']}"
    bad = failed(name, data, "return a dict with the three sizes (ints) and sequence_parallel (a bool)")
    if bad is not None:
        return bad
    if type(data) is not list or len(data) != min(int(draws), MAX_DRAWS):
        return report(name, False, f"expected {draws} draws")
    seen = {}
    for row in data:
        if type(row) is not list or len(row) != 4 or any(type(v) is not int for v in row[:3]) or type(row[3]) is not bool:
            return report(name, False, f"a draw is not a layout: {str(row)[:80]}")
        lay = {"world_size": shape["world_size"], TP: row[0], CP: row[1], PP: row[2], SP: row[3]}
        why = why_invalid(lay, shape)
        if why:
            return report(name, False, f"drew an invalid layout ({_name(lay) if min(row[:3]) > 0 else row}): {why}",
                          "draw tp among the divisors of the world that divide the heads, then cp among "
                          "the divisors of what is left, ..., or draw and redraw until the rules hold")
        seen[_key(lay)] = seen.get(_key(lay), 0) + 1
    every = valid_layouts(shape)
    missed = [lay for lay in every if _key(lay) not in seen]
    if missed:
        return report(name, False, f"{len(missed)} of the {len(every)} valid layouts never drawn in {len(data)} "
                      f"draws, e.g. {_name(missed[0])}", "a fuzzer that cannot draw a layout never tests it: "
                      "every size that divides, not only powers of two; SP on and off")
    return report(name, True, f"{len(data)} draws, all valid; all {len(every)} valid layouts drawn "
                  f"(each {min(seen.values())} to {max(seen.values())} times)")


# -- shrinking ----------------------------------------------------------------------------------------
START = {"world_size": 8, TP: 2, CP: 2, PP: 1, SP: True}
NEEDS = {"needs": {"tp": 2, "cp": 2}, "sp": True}


def _produce_shrink(student, start=START, bug=NEEDS, shape=SHAPE, budget=60):
    fn = student.load()["shrink"]
    asked = []

    def still_fails(layout) -> bool:
        lay = _plain_layout(layout)
        if isinstance(lay, str):
            raise TypeError(f"still_fails got {lay}")
        if len(asked) >= budget:
            raise RuntimeError(f"still_fails called more than {budget} times")
        asked.append(_key(lay))
        return why_invalid(lay, shape) is None and fails(lay, bug)
    got, bad = call(fn, dict(start), dict(shape), still_fails)
    if bad:
        return bad
    lay = _plain_layout(got)
    if isinstance(lay, str):
        return failure("invalid", f"shrink returned {lay}")
    return {"result": [lay["world_size"], lay[TP], lay[CP], lay[PP], lay[SP]], "calls": len(asked)}


def _judge_shrink(data, start=START, bug=NEEDS, shape=SHAPE, budget=60):
    name = f"shrink from {_name(start)}"
    bad = failed(name, data, "return the smallest layout found, a dict like the one shrink was given")
    if bad is not None:
        return bad
    if type(data) is not dict or type(data.get("result")) is not list or len(data["result"]) != 5:
        return report(name, False, "not a layout")
    w, t, c, p, sp = data["result"]
    lay = {"world_size": w, TP: t, CP: c, PP: p, SP: sp}
    if any(type(v) is not int for v in (w, t, c, p)) or type(sp) is not bool or min(w, t, c, p) < 1 or \
            why_invalid(lay, shape):
        return report(name, False, f"returned an invalid layout {data['result']}")
    if not fails(lay, bug):
        return report(name, False, f"returned {_name(lay)}, which does not fail",
                      "keep a candidate only when still_fails(candidate) is True")
    worse = [n for n in neighbours(lay) if why_invalid(n, shape) is None and fails(n, bug)]
    if worse:
        return report(name, False, f"returned {_name(lay)}, but {_name(worse[0])} is simpler and still fails",
                      "repeat: after each simplification that still fails, try every simplification again")
    if type(data.get("calls")) is not int or data["calls"] > budget:
        return report(name, False, f"asked still_fails more than {budget} times")
    return report(name, True, f"{_name(lay)}: fails, and no simpler layout does ({data['calls']} runs)")


# -- naming a finding ---------------------------------------------------------------------------------
def _features(layout: dict) -> dict:
    from ..config import BYTE_VOCAB_SIZE, train_config
    cfg = train_config(**layout["config"])
    topo = cfg.validate(layout["world_size"])
    return {"tp": topo.tp, "cp": topo.cp, "pp": topo.pp, "dp": topo.dp, "vpp": cfg.virtual_pipeline_size(),
            "sp": bool(cfg.sequence_parallel and topo.tp > 1), "tied": not cfg.untie_embeddings_and_output_weights,
            "moe": cfg.num_experts is not None, "etp": topo.etp, "zero": cfg.effective_zero_stage,
            "padded_vocab": cfg.model_config().vocab_size != BYTE_VOCAB_SIZE}


def bug_of(seed: int) -> str:
    from ..debug.composition import WHEN
    return random.Random(f"fuzzing-lab-{seed}").choice(sorted(WHEN))


def fuzz_table(seed: int, rows: int = 12) -> list[dict]:
    """Drawn layouts (``labkit.fuzz``'s sampler, seed ``seed``) that the rule book accepts, each as
    the features the composition bugs depend on and ``diverged``: whether the build with the bug
    ``seed`` planted leaves one device there. At least ``rows``, and as many more as it takes for
    the table to tell that bug from the five others."""
    from ..config import train_config
    from ..debug.composition import WHEN
    from ..fuzz.run import draw_layouts
    from ..fuzz.space import refusal
    bug = bug_of(seed)
    for count in (40, 160, 400):                # drawing is Hypothesis's: more only when needed
        table, acts = [], {name: [] for name in WHEN}
        for layout in draw_layouts(seed, count):
            if refusal(layout) is not None:
                continue
            cfg = train_config(**layout["config"])
            topo = cfg.validate(layout["world_size"])
            for name, when in WHEN.items():
                acts[name].append(bool(when(cfg, topo)))
            table.append({**_features(layout), "diverged": acts[bug][-1]})
            if len(table) >= rows and sum(acts[n] == acts[bug] for n in WHEN) == 1 and any(acts[bug]):
                return table
    raise RuntimeError(f"seed {seed}: 400 layouts did not tell {bug} from the others")


def _produce_finding(student):
    got = student.load()
    answer = got["answer"]
    return {"seed": got["seed"] if type(got["seed"]) is int else None,
            "answer": None if answer is None else str(answer)[:200]}


def _judge_finding(data):
    from ..debug.composition import WHEN
    name = "name_the_finding"
    bad = failed(name, data, 'answer = "the bug\'s name" (one of the six)')
    if bad is not None:
        return bad
    if type(data.get("seed")) is not int:
        return report(name, False, "SEED is not a whole number", "keep SEED = the number your instructor gave you")
    want, got = bug_of(data["seed"]), (data.get("answer") or "").strip()
    if got not in WHEN:
        return report(name, False, f"seed {data['seed']}: {got!r} is not one of the six bugs' names",
                      "copy a name from the list the table cell prints")
    if got != want:
        return report(name, False, f"seed {data['seed']}: the table does not fit {got}",
                      "for each bug, write its condition over the features and keep the one that is True "
                      "exactly on the rows that diverged")
    return report(name, True, f"seed {data['seed']}: {want}, the only bug whose condition fits every row")


SPECS = {
    "valid-layouts": Spec("valid-layouts", {"draw": "draw_layout"}, _produce_sampler, _judge_sampler,
                          cases=({"shape": SHAPE, "draws": 2000, "seed": 0},),
                          forbid=("labkit.fuzz.space:axes", "labkit.fuzz.space:layouts",
                                  "labkit.check.fuzzing:valid_layouts"),
                          hints=("list the divisors of the world size; keep those tp that divide the heads",
                                 "draw tp, then cp among the divisors of world // tp, then pp among those of "
                                 "world // (tp cp); skip a draw that breaks a rule and draw again",
                                 "SP only when tp > 1: draw it as rng.random() < 0.5 and then force False at tp = 1")),
    "shrink-layout": Spec("shrink-layout", {"shrink": "shrink"}, _produce_shrink, _judge_shrink,
                          cases=({"start": START, "bug": NEEDS, "shape": SHAPE, "budget": 60},),
                          forbid=("labkit.fuzz.shrink:shrink", "labkit.fuzz.shrink:candidates",
                                  "labkit.check.fuzzing:neighbours"),
                          hints=("a candidate: one of dp, tp, cp, pp made smaller (the world with it), or SP off",
                                 "keep the first candidate that still fails and start again from it; stop when "
                                 "no candidate fails")),
    "name-the-finding": Spec("name-the-finding", {"answer": "answer", "seed": "SEED"}, _produce_finding,
                             _judge_finding, cases=({},),
                             hints=("write the six conditions of the chapter's table as functions of a row",
                                    "keep the bug whose condition is True on every row that diverged and False "
                                    "on every row that did not")),
}
hint = asker(SPECS)


def valid_layouts_check(draw_layout):
    """Does ``draw_layout`` draw only valid layouts, and every one? Prints one [check] line."""
    return run(SPECS["valid-layouts"], {"draw": draw_layout}, **SPECS["valid-layouts"].cases[0])


def shrink_check(shrink):
    """Does ``shrink`` reach a failing layout none of whose neighbours fails? Prints one [check] line."""
    return run(SPECS["shrink-layout"], {"shrink": shrink}, **SPECS["shrink-layout"].cases[0])


def finding_check(answer, seed: int):
    """Is ``answer`` the bug ``seed`` planted? Prints one [check] line."""
    return run(SPECS["name-the-finding"], {"answer": answer, "seed": seed})

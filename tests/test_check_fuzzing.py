"""The fuzzing lab's checks (``labkit.check.fuzzing``): the master's answers pass every case, hidden
ones included; samplers, shrinkers and names that are wrong in the ways students get them wrong fail;
the lab's validity rules are labkit's rule book's on every layout of the cases' shapes (but one,
said in the module: SP at tp = 1)."""
import itertools
import json
import random
from pathlib import Path

import pytest

from labkit.check import fuzzing
from labkit.check.fuzzing import CP, PP, SP, TP, SPECS
from labkit.check.spec import run

ROOT = Path(__file__).resolve().parents[1]
HIDDEN = json.loads((ROOT / "solutions" / "hidden" / "fuzzing-lab.json").read_text())
nbformat = pytest.importorskip("nbformat")


def _master() -> dict:
    """The master's solution cells, run: {name: object}."""
    nb = nbformat.read(ROOT / "solutions" / "fuzzing-lab.ipynb", as_version=4)
    ns = {}
    for cell in nb.cells:
        lab = cell.metadata.get("labkit", {})
        if cell.cell_type == "code" and (lab.get("role") == "setup" or
                                         (lab.get("role") == "solution" and lab.get("exercise") != "name-the-finding")):
            exec(cell.source, ns)  # noqa: S102 - the course's own master
    return ns


MASTER = _master()


def _passes(spec_id, objects, case) -> bool:
    return run(SPECS[spec_id], objects, **case).passed


@pytest.mark.parametrize("k", range(4))
def test_the_masters_sampler_passes_every_case(k):
    cases = [*SPECS["valid-layouts"].cases, *HIDDEN["valid-layouts"]]
    assert _passes("valid-layouts", {"draw": MASTER["draw_layout"]}, cases[k])


def test_samplers_that_are_wrong_fail():
    def powers_of_two(rng, shape):                 # valid on world 8, blind to 3s: fails world 6
        while True:
            t, c, p = (rng.choice([1, 2, 4, 8]) for _ in range(3))
            lay = {"world_size": shape["world_size"], TP: t, CP: c, PP: p, SP: t > 1 and rng.random() < 0.5}
            if fuzzing.why_invalid(lay, shape) is None:
                return lay

    def never_sp(rng, shape):
        return {**MASTER["draw_layout"](rng, shape), SP: False}

    def unchecked(rng, shape):                     # draws divisors but forgets the heads and layers
        w = shape["world_size"]
        t = rng.choice([d for d in range(1, w + 1) if w % d == 0])
        return {"world_size": w, TP: t, CP: 1, PP: 1, SP: False}

    visible, world6 = SPECS["valid-layouts"].cases[0], HIDDEN["valid-layouts"][0]
    assert _passes("valid-layouts", {"draw": powers_of_two}, visible)
    assert not _passes("valid-layouts", {"draw": powers_of_two}, world6)
    assert not _passes("valid-layouts", {"draw": never_sp}, visible)
    assert not _passes("valid-layouts", {"draw": unchecked}, visible)


@pytest.mark.parametrize("k", range(4))
def test_the_masters_shrinker_passes_every_case(k):
    cases = [*SPECS["shrink-layout"].cases, *HIDDEN["shrink-layout"]]
    assert _passes("shrink-layout", {"shrink": MASTER["shrink"]}, cases[k])


def test_shrinkers_that_are_wrong_fail():
    def one_pass(layout, shape, still_fails):     # takes the first simplification and stops
        for cand in _halves(layout):
            if still_fails(cand):
                return cand
        return layout

    def keeps_anything(layout, shape, still_fails):
        return {"world_size": 1, TP: 1, CP: 1, PP: 1, SP: False}

    def wasteful(layout, shape, still_fails):     # right answer, 100 runs
        for _ in range(100):
            still_fails(layout)
        return MASTER["shrink"](layout, shape, still_fails)

    case, tp4 = SPECS["shrink-layout"].cases[0], HIDDEN["shrink-layout"][2]
    assert _passes("shrink-layout", {"shrink": one_pass}, case)          # one step happens to be enough there
    assert not _passes("shrink-layout", {"shrink": one_pass}, tp4)       # not here: cp 2 -> 1 is left undone
    for bad in (keeps_anything, wasteful):
        assert not _passes("shrink-layout", {"shrink": bad}, case), bad.__name__


def _halves(lay):
    dp = lay["world_size"] // (lay[TP] * lay[CP] * lay[PP])
    if dp > 1:
        yield {**lay, "world_size": lay["world_size"] // 2}


@pytest.mark.slow
def test_a_name_is_judged_against_the_seeds_bug():           # 5 to 40 s: Hypothesis draws the table
    table = fuzzing.fuzz_table(7)
    want = fuzzing.bug_of(7)
    assert any(r["diverged"] for r in table) and not all(r["diverged"] for r in table)
    assert _passes("name-the-finding", {"answer": want, "seed": 7}, {})
    other = next(n for n in sorted(__import__("labkit.debug.composition", fromlist=["WHEN"]).WHEN) if n != want)
    assert not _passes("name-the-finding", {"answer": other, "seed": 7}, {})
    assert not _passes("name-the-finding", {"answer": want, "seed": "7"}, {})


def test_the_labs_rules_are_the_rule_books_but_sp_at_tp_1():
    from labkit.fuzz.space import refusal
    shapes = [c["shape"] for c in (*SPECS["valid-layouts"].cases, *HIDDEN["valid-layouts"])]
    compared = 0
    for shape in shapes:
        w = shape["world_size"]
        divs = [d for d in range(1, w + 1) if w % d == 0]
        for t, c, p in itertools.product(divs, divs, divs):
            if w % (t * c * p):
                continue
            lay = {"world_size": w, TP: t, CP: c, PP: p, SP: t > 1 and random.Random(t * c * p).random() < 0.5}
            cfg = dict(num_layers=shape["num_layers"], num_attention_heads=shape["num_attention_heads"],
                       hidden_size=8 * shape["num_attention_heads"], seq_length=shape["seq_length"],
                       micro_batch_size=1, **{k: lay[k] for k in (TP, CP, PP, SP)})
            book = refusal({"world_size": w, "implementation": "labkit", "config": cfg})
            assert (book is None) == (fuzzing.why_invalid(lay, shape) is None), (lay, shape, book)
            compared += 1
    assert compared > 50

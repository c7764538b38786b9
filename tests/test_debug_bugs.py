"""The first-divergence tool (labkit.debug) finds each planted bug at the right layer and collective.

Issue 22, "Done when": each planted bug of ``labkit.debug.BUGS`` is located by the tool, and with
no bug the tool reports no divergence (the clean run of each bug's layout, and four ranks with TP,
SP and PP over two iterations: no false alarm from round-off). The bugs of one layout share its
reference and clean run. Tier 1 checks the ordering and the trace comparison on made-up records.
"""
from __future__ import annotations

import re

import pytest

from labkit.debug import BUGS, first_divergence
from labkit.debug.bugs import LAB_BUGS, MODEL, assigned_bug, assignment, resolve
from labkit.debug.compare import first_divergence_of, first_trace_difference, order_key
from labkit.debug.divergence import record, reference
from labkit.debug.trace import Collective


@pytest.fixture(scope="module")
def clean_runs():
    """{layout: (reference fingerprints, a clean run's recording)}, shared by the bugs of a layout."""
    return {}


def _clean(cache, bug):
    key = repr(sorted(bug.layout.items()))
    if key not in cache:
        kw = bug.kwargs()
        cache[key] = (reference(**kw), record(**kw))
    return cache[key]


@pytest.mark.parametrize("name", LAB_BUGS)   # composition bugs: tests/test_fuzz_bugs.py
def test_each_planted_bug_is_found_where_it_is(name, clean_runs):
    bug = BUGS[name]
    if name == "cp_wrong_causal_offset":            # the whole tool, once: its own clean run
        d = first_divergence(inject=name, **bug.kwargs())
    else:
        ref, clean = _clean(clean_runs, bug)
        assert first_divergence_of(clean, ref, MODEL["num_layers"]) is None, f"{name}: the clean run diverges"
        d = first_divergence_of(record(inject=name, **bug.kwargs()), ref, MODEL["num_layers"], clean)
    assert d is not None, f"{name}: no divergence found"
    want = bug.expect
    assert (d.iteration, d.phase, d.layer) == (want.get("iteration", 0), want["phase"], want["layer"]), str(d)
    assert want["tensor"] in d.tensor, str(d)
    if "microbatch" in want:
        assert d.microbatch == want["microbatch"], str(d)
    assert d.collective_name == want["collective"], str(d)
    if d.collective is not None:    # who issued it: labkit files and functions, no line numbers
        assert re.fullmatch(r"[\w/]+\.py \w+( <- [\w/]+\.py \w+)?", d.collective.site), d.collective.site


def test_no_bug_no_divergence():
    """Four ranks, three axes, two iterations (the clean run of every bug's layout is checked above)."""
    layout = dict(MODEL, tensor_model_parallel_size=2, sequence_parallel=True, pipeline_model_parallel_size=2,
                  num_layers=4)
    assert first_divergence(4, steps=2, **layout) is None


def test_the_tool_refuses_what_it_cannot_compare():
    with pytest.raises(ValueError, match="hidden_dropout 0.1: the first divergence is found against one device"):
        first_divergence(2, hidden_dropout=0.1, **MODEL)
    with pytest.raises(ValueError, match="params_dtype 'float32': the first divergence needs float64"):
        first_divergence(2, **{**MODEL, "params_dtype": "float32"})
    with pytest.raises(ValueError, match=r"inject must be one of \[.*'dp_grads_summed'"):
        first_divergence(2, inject="typo", **MODEL)


def test_assignments_hide_the_name_and_resolve_to_a_bug():
    seen = {assigned_bug(s).name for s in range(40)}
    assert seen == set(LAB_BUGS)                  # every single-axis bug can be assigned
    a = assignment(7)
    assert a["inject"] == "assigned-7" and resolve(a["inject"]) == assigned_bug(7).name
    assert not any(name in str(a) for name in BUGS)


def test_order_of_the_run():
    """weights < forward < backward < grads; forward by layer up, backward by layer down."""
    k = lambda *a: order_key(*a, num_layers=4)  # noqa: E731
    assert k(0, "weights", None, "decoder.layers.3", 0) < k(0, "forward", 0, "embedding", 0)
    assert k(0, "forward", 0, "decoder.layers.1", 0) < k(0, "forward", 0, "decoder.layers.2", 0)
    assert k(0, "backward", 0, "decoder.layers.2", 0) < k(0, "backward", 0, "decoder.layers.1", 0)
    assert k(0, "backward", 3, "embedding", 0) < k(0, "grads", None, "embedding", 0) < k(1, "weights", None, "embedding", 0)


def _c(i, inputs="a", outputs="b", op="all_reduce"):
    return Collective(i, op, "dp", ((4,), "->", (4,)), (0, "grads", None, None), "x", i, (inputs, 1.0), (outputs, 1.0))


def test_trace_difference_finds_a_changed_input_and_a_missing_collective():
    clean = [{"rank": 0, "collectives": [_c(0), _c(1), _c(2)]}, {"rank": 1, "collectives": [_c(0), _c(1)]}]
    bad = [{"rank": 0, "collectives": [_c(0), _c(1, inputs="z"), _c(2)]}, {"rank": 1, "collectives": [_c(0)]}]
    got = {r: (k, ours, theirs) for r, k, ours, theirs in first_trace_difference(bad, clean)}
    assert got[0][0] == 1 and got[0][1].inputs == ("z", 1.0)
    assert got[1] == (1, None, clean[1]["collectives"][1])
    assert first_trace_difference(clean, clean) == []


def test_command_line(capsys):
    """``python -m labkit diverge --list-bugs``; the train flags of checkpoints parse."""
    from labkit.__main__ import main, train_parser
    assert main(["diverge", "--list-bugs"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in BUGS)
    args = train_parser().parse_args(["--save", "a", "--save-interval", "2", "--load", "b", "--async-save"])
    assert (args.save, args.save_interval, args.load, args.async_save) == ("a", 2, "b", True)
    assert main(["diverge", "--world-size", "2", "--inject", "nope"]) == 2
    assert "inject must be one of" in capsys.readouterr().err

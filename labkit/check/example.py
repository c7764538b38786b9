"""The smallest lab: three one-line exercises, for instructors and for the grader's own tests.

It shows the whole protocol of a check (:mod:`labkit.check.spec`) without a rank in sight: each
exercise is a ``produce`` that calls the student's function on the case's inputs and returns what
it gave, and a ``judge`` that compares with the answer computed here. ``tests/fixtures/tiny-master.ipynb``
is its master; ``book/instructors.md`` walks through it.

* ``double(x)``: twice x (1 point).
* ``mean(values)``: the arithmetic mean (2 points, one case per list: partial credit).
* ``shout(text)``: upper case and one "!" (1 point).
"""
from __future__ import annotations

from . import report
from .hints import asker
from .spec import Spec, call, failed, run
from .compare import far, same


def _produce(role, inputs):
    def produce(student, **case):
        fn = student.load()[role]
        outs = []
        for x in case.get(inputs, ()):
            got, failure = call(fn, x)
            if failure:
                return failure
            outs.append(got if isinstance(got, (int, float, str, type(None))) else repr(got)[:100])
        return outs
    return produce


def _judge_double(data, xs=(0, 3, -2.5)):
    bad = failed("double", data)
    if bad is not None:
        return bad
    if type(data) is not list or len(data) != len(xs):
        return report("double", False, f"got {len(data) if type(data) is list else 'no'} results for {len(xs)} inputs")
    for x, got in zip(xs, data):
        if not same(got, 2 * x):
            return report("double", False, f"double({x!r}) returned {got!r}, which is not twice {x!r}",
                          "twice, not plus two")
    return report("double", True, f"double(x) is twice x for {', '.join(map(repr, xs))}")


def _judge_mean(data, values=(1, 2, 3)):
    name = f"mean of {len(values)} values"
    bad = failed(name, data)
    if bad is not None:
        return bad
    got = data[0] if data else None
    if far(got, sum(values) / len(values), 1e-12):
        return report(name, False, f"mean({list(values)!r}) returned {got!r}", "sum, then divide by the count")
    return report(name, True, f"mean({list(values)!r}) = {got!r}")


def _judge_shout(data, texts=("hi",)):
    bad = failed("shout", data)
    if bad is not None:
        return bad
    if type(data) is not list or len(data) != len(texts):
        return report("shout", False, f"got {len(data) if type(data) is list else 'no'} results for {len(texts)} inputs")
    for text, got in zip(texts, data):
        if type(got) is not str or got != text.upper() + "!":
            return report("shout", False, f"shout({text!r}) returned {got!r}", "upper case, then one '!'")
    return report("shout", True, " and ".join(f"shout({t!r}) == {t.upper() + '!'!r}" for t in texts))


def _mean_inputs(student, values=(1, 2, 3)):
    return _produce("mean", "lists")(student, lists=[list(values)])


SPECS = {
    "double": Spec("double", {"double": "double"}, _produce("double", "xs"), _judge_double,
                   cases=({"xs": [0, 3, -2.5]},), hints=("2 * x",)),
    "mean": Spec("mean", {"mean": "mean"}, _mean_inputs, _judge_mean,
                 cases=({"values": [1, 2, 3]}, {"values": [2.5]}),
                 hints=("sum(values) / len(values)",)),
    "shout": Spec("shout", {"shout": "shout"}, _produce("shout", "texts"), _judge_shout,
                  cases=({"texts": ["hi"]},), hints=("text.upper() + '!'",)),
}
hint = asker(SPECS)


def check_double(fn):
    return run(SPECS["double"], {"double": fn}, xs=[0, 3, -2.5])


def check_mean(fn, values):
    return run(SPECS["mean"], {"mean": fn}, values=list(values))


def check_shout(fn):
    return run(SPECS["shout"], {"shout": fn}, texts=["hi"])

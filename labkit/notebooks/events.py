"""The runner's lines, read as a schema: each one checked for size, depth, kind and field types.

Everything the sandbox writes on its answer pipe is the submission's to choose. A line that is
too long, nested too deep (``"[" * 100000`` once raised ``RecursionError`` out of the grader and
ended the run for every later student), not JSON, of a kind the protocol does not have, or with a
field of the wrong type is a :class:`ProtocolError`: that exercise's error, never the grader's.
What passes is rebuilt from fresh plain values (strings cut to their limits), so nothing the
submission shaped travels further than its declared fields.

    cell    {"index": int, "where": str}         an answer cell starts
    cells   {"errors": [[str, str], ...]}        the answer cells ran (which raised)
    case    {"index": int}                        a check case starts
    data    {"index": int, "data": JSON}          a case's data (checked by labkit.check.wire)
    legacy  {"stdout": str, "error": str}         an in-process check cell's output
    error   {"message": str}                      the runner could not start the job
    done    {}
"""
from __future__ import annotations

import json
import re

MAX_LINE = 64 * 2**20 + 4096         # one line: a case's data (labkit.check.wire.MAX_BYTES) and its frame
MAX_DEPTH = 40                       # wire data is at most 32 deep, inside its event
MAX_ERRORS = 200                     # answer cells reported as raising
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


class ProtocolError(ValueError):
    """A line the grader's protocol does not allow."""


def clean(text, limit: int = 2000) -> str:
    """``text`` as a plain string of at most ``limit`` characters without control characters (a
    terminal escape in a message could draw a fake PASS line on the instructor's terminal)."""
    text = text if type(text) is str else str(text)
    return _CONTROL.sub("", text[:limit * 2])[:limit]


def depth(obj) -> int:
    """How deep lists and dicts nest in ``obj``, walked without recursion."""
    deepest, todo = 0, [(obj, 1)]
    while todo:
        x, d = todo.pop()
        if type(x) in (list, dict):
            deepest = max(deepest, d)
            if d <= MAX_DEPTH:                    # deeper than that is refused: no need to look further
                todo.extend((v, d + 1) for v in (x.values() if type(x) is dict else x))
    return deepest


def _int(ev: dict, key: str) -> int:
    v = ev.get(key)
    if type(v) is not int or not 0 <= v < 10**6:
        raise ProtocolError(f"field {key!r} is not a small int")
    return v


def _str(ev: dict, key: str, limit: int) -> str:
    v = ev.get(key, "")
    if type(v) is not str:
        raise ProtocolError(f"field {key!r} is not a string")
    return clean(v, limit)


def _errors(ev: dict) -> list:
    errors = ev.get("errors")
    if type(errors) is not list or len(errors) > MAX_ERRORS:
        raise ProtocolError("field 'errors' is not a list of [where, error]")
    out = []
    for item in errors:
        if type(item) is not list or len(item) != 2 or not all(type(x) is str for x in item):
            raise ProtocolError("field 'errors' is not a list of [where, error]")
        out.append([clean(item[0], 200), clean(item[1], 400)])
    return out


def parse(line: bytes) -> dict:
    """The event of one line, rebuilt from its declared fields; :class:`ProtocolError` otherwise."""
    if len(line) > MAX_LINE:
        raise ProtocolError(f"a line of more than {MAX_LINE} bytes")
    try:                          # the C scanner stops a deep text with RecursionError, cleanly
        ev = json.loads(line)
    except RecursionError:
        raise ProtocolError(f"a line nested deeper than {MAX_DEPTH}") from None
    except (ValueError, MemoryError):
        raise ProtocolError("a line that is not JSON") from None
    if depth(ev) > MAX_DEPTH:
        raise ProtocolError(f"a line nested deeper than {MAX_DEPTH}")
    if type(ev) is not dict or type(ev.get("event")) is not str:
        raise ProtocolError("a line that is not an event")
    kind = ev["event"]
    if kind == "cell":
        return {"event": kind, "index": _int(ev, "index"), "where": _str(ev, "where", 200)}
    if kind == "cells":
        return {"event": kind, "errors": _errors(ev)}
    if kind == "case":
        return {"event": kind, "index": _int(ev, "index")}
    if kind == "data":
        if "data" not in ev:
            raise ProtocolError("a data event without data")
        return {"event": kind, "index": _int(ev, "index"), "data": ev["data"]}
    if kind == "legacy":
        return {"event": kind, "stdout": _str(ev, "stdout", 20000), "error": _str(ev, "error", 400)}
    if kind == "error":
        return {"event": kind, "message": _str(ev, "message", 400)}
    if kind == "done":
        return {"event": kind}
    raise ProtocolError(f"an event of unknown kind {clean(kind, 40)!r}")

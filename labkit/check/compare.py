"""The one way a judge compares: exact types first, then finite, then the tolerance.

``abs(got - want) > tol`` is False when ``got`` is NaN, so a judge written that way passed NaN
(issue 33: ``prediction = float('nan')`` got the bubble point, four NaNs got the capstone's 5/5).
A float subclass can lie in ``__eq__``, ``__sub__`` and ``__abs__``; ``True`` is an int; an int of
a thousand digits makes ``float(x)`` raise. So every judge goes through here:

* :func:`refuse` walks a whole answer before any judge reads it (``Spec.verdict`` calls it): only
  exact ``None``/``bool``/``int``/``float``/``str``/``list``/``tuple``/``dict`` and ``torch.Tensor``
  (never a subclass), ints within +-2**53, floats and floating tensors finite (unless the exercise
  declares non-finite values part of its answer), at most :data:`MAX_ITEMS` values in all.
* :func:`number` / :func:`far` / :func:`close` compare one number: a value that is not an exact
  int or float (bools refused), or not finite, is never close to anything.
"""
from __future__ import annotations

import math

MAX_INT = 2**53                       # beyond it a float cannot hold the int: no honest count is that big
MAX_ITEMS = 2_000_000                 # values in one answer (the largest honest one holds far fewer)
PLAIN = (type(None), bool, int, float, str, list, tuple, dict)


def number(x, integer: bool = False):
    """``x`` as a plain int or float, or None when it is not one: a bool, a subclass, a huge int,
    NaN or an infinity (and a float when ``integer``)."""
    if type(x) is int:
        return x if -MAX_INT <= x <= MAX_INT else None
    if type(x) is float and not integer:
        return x if math.isfinite(x) else None
    return None


def far(got, want, tol: float) -> bool:
    """True unless ``got`` is a finite plain number within ``tol`` of ``want`` (NaN is far)."""
    g = number(got)
    return g is None or not abs(g - want) <= tol


def close(got, want, tol: float) -> bool:
    return not far(got, want, tol)


def equal_int(got, want: int) -> bool:
    """``got`` is exactly the int ``want`` (not True for 1, not 2.0 for 2, not a lying subclass)."""
    return type(got) is int and got == want


def refuse(data, allow_nonfinite: bool = False) -> str:
    """Why ``data`` cannot be an answer at all ("" when it can), without recursion."""
    todo, count = [data], 0
    while todo:
        x = todo.pop()
        count += 1
        if count > MAX_ITEMS:
            return f"more than {MAX_ITEMS} values"
        t = type(x)
        if t in (list, tuple):
            todo.extend(x)
        elif t is dict:
            if any(type(k) is not str for k in x):
                return "a dict whose keys are not all str"
            todo.extend(x.values())
        elif t is int:
            if not -MAX_INT <= x <= MAX_INT:
                return f"an int of {len(str(abs(x))) if abs(x) < 10**4000 else 'thousands of'} digits"
        elif t is float:
            if not (allow_nonfinite or math.isfinite(x)):
                return f"a non-finite number ({x!r})"
        elif t not in PLAIN:
            why = _tensor(x, allow_nonfinite)
            if why:
                return why
            count += x.numel() if why == "" else 0
    return ""


def _tensor(x, allow_nonfinite: bool) -> str:
    import torch
    if type(x) is not torch.Tensor:
        return f"a {type(x).__name__}, not plain data"
    if x.is_floating_point() and not allow_nonfinite and not bool(torch.isfinite(x).all()):
        return "a tensor with non-finite values (NaN or inf)"
    if x.is_complex():
        return "a complex tensor"
    return ""


def same(got, want) -> bool:
    """``got == want`` with exact types all the way down (lists and tuples alike): ``-0.0`` or
    ``True`` is not the rank ``0`` or ``1``, a lying subclass equals nothing."""
    if type(want) in (list, tuple):
        return type(got) in (list, tuple) and len(got) == len(want) and all(same(g, w) for g, w in zip(got, want))
    if type(want) is dict:
        return type(got) is dict and got.keys() == want.keys() and all(same(got[k], want[k]) for k in want)
    return type(got) is type(want) and got == want

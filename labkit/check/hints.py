"""Hints on request: ``check.hint("conjugates")`` prints the next hint of that exercise, one at a time.

A failing check says *what* differs (the rank, the tensor, the element, the classic bug it looks
like). How to fix it is the student's to ask for: each exercise has an ordered list of hints, from
"where to look" to "which idea to use"; each call reveals one more, and says how many are left.
"""
from __future__ import annotations

_shown: dict[str, int] = {}     # exercise id -> hints revealed so far (this kernel)


def ask(spec) -> str:
    """Print and return the next hint of ``spec`` (a :class:`~labkit.check.spec.Spec`)."""
    hints = list(spec.hints)
    if not hints:
        text = f"[hint] {spec.id}: no hints for this exercise"
    else:
        k = _shown.get(spec.id, 0)
        _shown[spec.id] = min(k + 1, len(hints))
        k = min(k, len(hints) - 1)
        more = "" if k == len(hints) - 1 else f"; check.hint({spec.id!r}) again for the next"
        text = f"[hint {k + 1} of {len(hints)}] {spec.id}: {hints[k]}{more}"
    print(text)
    return text


def reset(exercise_id: str | None = None) -> None:
    """Forget what was revealed (of one exercise, or of all)."""
    if exercise_id is None:
        _shown.clear()
    else:
        _shown.pop(exercise_id, None)


def asker(specs: dict):
    """A lab module's ``hint(exercise_id)`` over its specs."""
    def hint(exercise_id: str) -> str:
        """Print the next hint for ``exercise_id`` (one more each call)."""
        if exercise_id not in specs:
            raise ValueError(f"no exercise {exercise_id!r} here; exercises: {sorted(specs)}")
        return ask(specs[exercise_id])
    return hint

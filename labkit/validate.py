"""One check written once: a count given as an argument (a size, a number of layers, steps) is an int.

Pure Python, no imports: the config, the topology, the schedules, the spec and labkit.calc use it,
and it runs unchanged in the browser with labkit.calc (Pyodide; book/_ext/labkit_static.py ships
it). ``bool`` is refused although Python counts it as an ``int`` (``True`` is not a size). The
message names the field and the value: "tp must be a positive integer, got 0".
"""
from __future__ import annotations


def int_at_least(name: str, value, low: int, allow_none: bool = False, what: str | None = None):
    """``value`` if it is an int >= ``low`` (or None, when ``allow_none``); else ValueError
    "``name`` must be ``what``, got ``value``" (``what``: "an integer >= low" unless given)."""
    if value is None and allow_none:
        return value
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be {what or f'an integer >= {low}'}, got {value!r}")
    return value


def positive_int(name: str, value, allow_none: bool = False, note: str = ""):
    """``value`` if it is an int >= 1 (or None, when ``allow_none``); else ValueError
    "``name`` must be a positive integer``note``, got ``value``"."""
    return int_at_least(name, value, 1, allow_none, "a positive integer" + note)

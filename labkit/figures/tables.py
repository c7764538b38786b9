"""Tables for the book: a DataFrame as the HTML table a reader should see (issue 36, defect 8).

pandas' own HTML carries three notebook traces into the book: a second header row that holds only
the index's name (a named index, ``set_index("layout")``), "32.0" for integers stored as floats (a
column with a missing value, or built by arithmetic), and long cells cut to 50 characters with
"...". :func:`html` writes one header row (the index's names head its columns, which stay row
labels, ``<th>``), a float column whose values are all whole numbers as integers, and every cell
whole. :func:`install` makes it the HTML form of every DataFrame a notebook displays; the text form
(what ``print`` and nbval's text compare see) stays pandas' own::

    from labkit.figures import tables
    tables.install()          # in the notebook's setup cell
"""
from __future__ import annotations

from html import escape

import numpy as np
import pandas as pd
from pandas.io.formats.format import format_array


def _is_default_index(index: pd.Index) -> bool:
    """0, 1, 2, ... with no name: a numbering pandas added, which the reader need not see."""
    return (isinstance(index, pd.RangeIndex) and index.name is None and index.start == 0
            and index.step == 1)


def _column_label(names, key) -> str:
    """One header per column: the levels of a MultiIndex column joined, each with its level's name
    ("op, rank 0" for ``unstack`` of a "rank" level)."""
    if not isinstance(key, tuple):
        return str(key)
    parts = [f"{n} {v}" if n else str(v) for n, v in zip(names, key) if str(v) != ""]
    return ", ".join(parts)


def _cells(values: pd.Index | pd.Series) -> list[str]:
    """A column's values as pandas writes them (shared precision), whole numbers as integers."""
    arr = np.asarray(values) if isinstance(values.dtype, np.dtype) else values.array
    if isinstance(arr, np.ndarray) and arr.dtype.kind == "f":
        # whole up to float round-off (8 * 5e-6 * 300e9 / 1e6 is 12.000000000000002), relative to
        # the value itself: a difference of 8.9e-16 is not a 0 (an absolute cut printed it as one)
        finite = arr[np.isfinite(arr)]
        if (finite.size and np.all(np.abs(finite) < 2**53)
                and np.all(np.abs(finite - np.round(finite)) <= 1e-12 * np.abs(finite))):
            return ["NaN" if np.isnan(x) else str(int(np.round(x))) for x in arr]
    with pd.option_context("display.max_colwidth", None):
        return [s.strip() for s in format_array(arr, None)]


def _sparse(labels: list[list[str]]) -> list[list[str]]:
    """Blank a row label that repeats the row above in this level and every level before it, as
    pandas does for a MultiIndex (the last level is always written)."""
    out = [row[:] for row in labels]
    for i in range(1, len(labels)):
        for j in range(len(labels[i]) - 1):
            if labels[i][:j + 1] != labels[i - 1][:j + 1]:
                break
            out[i][j] = ""
    return out


def html(df: pd.DataFrame) -> str:
    """``df`` as an HTML table: one header row, row labels as ``<th>``, no cut cells."""
    if _is_default_index(df.index):
        labels, heads = [[] for _ in range(len(df))], []
    else:
        levels = [df.index.get_level_values(k) for k in range(df.index.nlevels)]
        labels = _sparse([list(row) for row in zip(*[_cells(v) for v in levels])])
        heads = [str(n) if n is not None else "" for n in df.index.names]
        if heads == [""] and df.columns.name is not None:  # a transposed table: its name heads the labels
            heads = [str(df.columns.name)]
    cols = [_column_label(df.columns.names, c) for c in df.columns]
    body = [_cells(df.iloc[:, j]) for j in range(df.shape[1])]
    out = ['<table border="1" class="dataframe">', "  <thead>", '    <tr style="text-align: right;">']
    out += [f"      <th>{escape(h)}</th>" for h in heads + cols]
    out += ["    </tr>", "  </thead>", "  <tbody>"]
    for i in range(len(df)):
        out.append("    <tr>")
        out += [f"      <th>{escape(x)}</th>" for x in labels[i]]
        out += [f"      <td>{escape(col[i])}</td>" for col in body]
        out.append("    </tr>")
    out += ["  </tbody>", "</table>"]
    return "\n".join(out)


def install(shell=None) -> None:
    """Make :func:`html` the HTML form of every DataFrame displayed in this IPython kernel (and
    Styler tables untouched). Outside IPython it does nothing."""
    if shell is None:
        from IPython import get_ipython
        shell = get_ipython()
    if shell is not None:
        shell.display_formatter.formatters["text/html"].for_type(pd.DataFrame, html)

"""Tables read as tables, not as notebook output (issue 36, defect 8).

73 of 92 tables in the book carried pandas' traces: a second header row holding only the index's
name, "32.0" for integers, cells cut with "...". labkit.figures.tables writes DataFrames without
them; this guard scans the HTML stored in the book's notebooks (what the built pages show) for all
three, and checks that the detector finds them in pandas' own HTML.
"""
import json
import re
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from labkit.figures import tables

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "book").glob("*.ipynb")) + sorted((ROOT / "labs").glob("*.ipynb"))


class _Tables(HTMLParser):
    """Every <table> of a page as {"head": rows, "body": rows}, a row a list of cell texts."""

    def __init__(self):
        super().__init__()
        self.tables, self.table, self.row, self.cell, self.part = [], None, None, None, "body"

    def handle_starttag(self, tag, attrs):
        if tag == "table":
            self.table = {"head": [], "body": []}
        elif tag in ("thead", "tbody"):
            self.part = "head" if tag == "thead" else "body"
        elif tag == "tr" and self.table is not None:
            self.row = []
        elif tag in ("td", "th") and self.row is not None:
            self.cell = ""

    def handle_endtag(self, tag):
        if tag == "table" and self.table is not None:
            self.tables.append(self.table)
            self.table = None
        elif tag == "tr" and self.row is not None:
            self.table[self.part].append(self.row)
            self.row = None
        elif tag in ("td", "th") and self.cell is not None:
            self.row.append(self.cell.strip())
            self.cell = None

    def handle_data(self, data):
        if self.cell is not None:
            self.cell += data


def table_traces(html: str) -> list[str]:
    """The notebook traces in the tables of an HTML text: a header row after the first with only its
    first cell filled (the index's name), a column whose every cell is a whole number written "N.0",
    a cell cut with "..."."""
    parser = _Tables()
    parser.feed(html)
    found = []
    for t in parser.tables:
        found += [f"index-name row {r[:2]}" for r in t["head"][1:]
                  if len(r) > 1 and r[0] and not any(r[1:])]
        rows = t["body"]
        for j in range(max((len(r) for r in rows), default=0)):
            col = [r[j] for r in rows if j < len(r)]
            if col and all(re.fullmatch(r"-?\d+\.0", c) for c in col):
                found.append(f"integers as floats {col[:3]}")
        found += [f"cut cell {c[-30:]!r}" for r in t["head"] + rows for c in r
                  if c.endswith(("...", "\u2026"))]
    return found


def _frame():
    # all three traces at once: a named index, integers in a float column (a NaN forces the dtype),
    # a cell longer than pandas' 50-character default
    return pd.DataFrame({"layout": ["dp2", "tp2"], "micro batch": [32.0, np.nan],
                         "plan": ["decoder.layers.0.self_attention.linear_qkv, " * 3, "x"]}).set_index("layout")


def test_detector_finds_the_traces_in_pandas_html():
    found = table_traces(_frame()._repr_html_())
    assert any(f.startswith("index-name row") for f in found), found
    assert any(f.startswith("cut cell") for f in found), found
    assert table_traces(pd.DataFrame({"n": [32.0, 64.0]})._repr_html_())  # integers as floats


def test_labkit_tables_write_none_of_them():
    df = _frame()
    html = tables.html(df)
    assert table_traces(html) == []
    assert ">32<" in html and ">layout<" in html and df.loc["dp2", "plan"].strip() in html
    # a MultiIndex keeps pandas' sparse labels; the default 0, 1, ... numbering is dropped
    multi = pd.DataFrame({"layout": ["a", "a", "b"], "rank": [0, 1, 0], "x": [1.5, 2.0, 3.0]})
    html = tables.html(multi.set_index(["layout", "rank"]))
    assert table_traces(html) == [] and html.count("<th>a</th>") == 1
    assert ">2.0<" in html  # a column with a fraction keeps pandas' shared precision
    assert "<th>0</th>" not in tables.html(multi)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_stored_tables_carry_no_notebook_traces(path):
    nb = json.loads(path.read_text())
    bad = [(i, trace) for i, cell in enumerate(nb["cells"]) for out in cell.get("outputs", [])
           for trace in table_traces("".join(out.get("data", {}).get("text/html", "")))]
    assert not bad, (f"{path.name}: tables with notebook traces (display DataFrames through "
                     f"labkit.figures.tables.install()): {bad[:5]}")


def test_whole_at_the_printed_digits_counts_as_whole():
    # collectives' N* = 8 alpha beta: 12.000000000000002 is printed "12.0" by pandas
    html = tables.html(pd.DataFrame({"N*": [8 * 5e-6 * 300e9 / 1e6, 6.0], "x": [0.5, 1.0]}))
    assert ">12<" in html and ">0.5<" in html and table_traces(html) == []


def test_a_small_difference_is_never_printed_as_zero():
    """Parity tables hold differences like 8.9e-16: whole-number detection is relative to the value,
    so they keep pandas' scientific notation instead of becoming "0"."""
    html = tables.html(pd.DataFrame({"loss diff": [8.9e-16, 0.0], "grad diff": [1e-9, 2e-7]}))
    assert "8.9" in html and "e-16" in html and "e-09" in html and "<td>0</td>" not in html

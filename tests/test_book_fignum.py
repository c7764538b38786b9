"""Figure numbers restart on every page (book/_ext/labkit_fignum.py; issue 36, round 2: "figure
numbers run book-wide (Fig. 65) instead of per chapter")."""
import re
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "book" / "_ext"))
from labkit_fignum import per_page      # noqa: E402


def test_each_page_counts_from_one_in_page_order():
    env = SimpleNamespace(toc_fignumbers={
        "book/a": {"figure": {"fig-a1": (1,), "fig-a2": (2,)}},
        "book/b": {"figure": {"fig-b2": (5,), "fig-b1": (3,), "fig-b3": (9,)}, "table": {"t": (4,)}},
    })
    per_page(None, env)
    assert env.toc_fignumbers == {
        "book/a": {"figure": {"fig-a1": (1,), "fig-a2": (2,)}},
        "book/b": {"figure": {"fig-b1": (1,), "fig-b2": (2,), "fig-b3": (3,)}, "table": {"t": (1,)}},
    }


def test_built_chapters_number_their_figures_from_one():
    html = ROOT / "_build" / "html" / "book"
    pages = sorted(html.glob("*.html")) if html.exists() else []
    if not pages:
        pytest.skip("no built book in _build/html (jupyter-book build . first)")
    numbered = 0
    for page in pages:
        nums = [int(n) for n in re.findall(r'<span class="caption-number">Fig\. (\d+)', page.read_text())]
        if nums:
            numbered += 1
            assert nums == list(range(1, len(nums) + 1)), (page.name, nums)
    assert numbered > 15, numbered

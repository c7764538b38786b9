"""Sphinx extension: figure numbers restart on every page (issue 36, round 2: "figure numbers run
book-wide (Fig. 65) instead of per chapter").

Sphinx numbers figures (and numbered tables and code blocks) by section number: with no numbered
toctree every figure has the empty section number, so one counter runs through the whole book. A
numbered toctree (``numbered: 1`` in _toc.yml, with ``numfig_secnum_depth: 1``) would give "Fig. 7.3",
but it also numbers every page title and sidebar entry, and the labs, which sit between the chapters,
would take chapter numbers of their own. This keeps the titles as they are and renumbers each page's
figures 1, 2, 3... in page order after Sphinx has assigned them. No {numref} of the book points at
another page's figure (a reference across pages would read as a figure of the page it is on).
"""
from __future__ import annotations


def per_page(app, env):
    """Rewrite ``env.toc_fignumbers`` ({doc: {figtype: {id: (n,)}}}) so each page counts from 1."""
    for by_type in env.toc_fignumbers.values():
        for figtype, numbers in by_type.items():
            order = sorted(numbers, key=numbers.get)        # book-wide numbers are in page order
            by_type[figtype] = {fig_id: (i + 1,) for i, fig_id in enumerate(order)}
    return []        # Sphinx's own collector has listed the pages whose numbers changed


def setup(app):
    # after sphinx's TocTreeCollector (priority 500), which assigns the book-wide numbers
    app.connect("env-get-updated", per_page, priority=900)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}

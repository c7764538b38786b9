"""The book's figures, drawn by code from labkit's own objects (schedules, Topology, shard plans,
calc), so a figure cannot drift from what runs and is proven by the same tests.

House rules for every figure (``style.py`` holds them as code):

* vector: SVG with real ``<text>`` (``svg.fonttype = "none"``) and a fixed hash salt, so the same
  inputs give byte-identical files;
* sized for a phone: at most :data:`style.MAX_WIDTH_IN` inches wide, every label at least
  :data:`style.MIN_LABEL_PX` CSS px when the figure is scaled to a 390 px screen's content column
  (:func:`style.smallest_label_px` checks it, without a browser);
* in a notebook, the cell that draws it is tagged ``remove-input`` and carries the caption, the
  name (for ``{numref}``) and the alt text in its metadata, which myst-nb turns into a numbered
  figure::

      "metadata": {"tags": ["remove-input"],
                   "mystnb": {"figure": {"caption": "What to look at ...", "name": "fig-tp-column-row"},
                              "image": {"alt": "Two GPUs each holding half of ..."}}}

  and the cell ends with ``labkit.figures.show(fig)``.
"""
from .style import MAX_WIDTH_IN, MIN_LABEL_PX, new, show, smallest_label_px, svg

__all__ = ["MAX_WIDTH_IN", "MIN_LABEL_PX", "new", "show", "smallest_label_px", "svg"]

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

One module per chapter, each a set of ``fig_*`` functions that return a matplotlib Figure drawn
from labkit's own objects or measured results (tests/test_figures_book.py draws every one and
checks the house rules)::

    collectives       each collective, the ring all-reduce step by step, bytes, alpha-beta
    data_parallel     buckets, naive vs bucketed overlap, ZeRO shards, ZeRO memory
    tensor_parallel   which weight slices a rank keeps, one layer with f / f-bar, vocab padding
    sequence_parallel one layer with g / g-bar, activations per layout, bytes per layer
    context_parallel  the ring, the causal split, FLOPs per rank, the gpt2-xl runs
    pipeline          GPipe / 1F1B / interleaved / ZB-H1 timelines, in-flight memory, bubbles
    expert_parallel   the all-to-all dispatch, load balance, drops, the expert grid
    ptdp              the rank grid, step time per layout, bytes per group, strategy memory
"""
from .style import MAX_WIDTH_IN, MIN_LABEL_PX, new, show, smallest_label_px, svg

__all__ = ["MAX_WIDTH_IN", "MIN_LABEL_PX", "new", "show", "smallest_label_px", "svg"]

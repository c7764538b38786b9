"""The planning chapter's figures (labkit/figures/planning.py): drawn from labkit.calc's data,
deterministic SVG, every label legible on a phone."""
import pytest

from labkit import figures
from labkit.calc import kernels
from labkit.figures import planning as pfig

pytest.importorskip("matplotlib")


def _check(fig):
    a = figures.svg(fig)
    assert a == figures.svg(fig)                               # deterministic bytes
    assert figures.smallest_label_px(a) >= figures.MIN_LABEL_PX
    return a


def test_attention_curves_show_published_points_and_fits():
    key = ("fa2", "A100", "fwd_bwd", 128)
    e, s0 = kernels.CURVES[key]
    fig = pfig.attention_curves([("FA-2, A100", dict(zip(kernels.SEQS, kernels.PUBLISHED[key])),
                                  lambda s: e * s / (s + s0))], [512, 8192, 131072])
    assert "FA-2, A100" in _check(fig)


def test_run_figures_are_legible():
    pts = [("a", 1.0, 1.1, False), ("b", 10.0, 9.0, True), ("a", 100.0, 95.0, False)]
    assert "b (held out)" in _check(pfig.predicted_vs_measured(pts, ["a", "b"]))
    panels = [("sequence length", True, [("a", 2048, 0.05, False), ("b", 65536, -0.1, True)]),
              ("precision", False, [("a", 1, 0.02, False)])]
    _check(pfig.residual_panels(panels, ["a", "b"]))
    # the real sources' names: the longest labels decide the width the page scales the figure to
    svg = _check(pfig.error_by_source([("megatron_bridge", 216, 0.05, (0.03, 0.08), 0.12),
                                       ("llm_foundry", 5, 0.04, (0.01, 0.07), None)]))
    assert "megatron_bridge (216)" in svg

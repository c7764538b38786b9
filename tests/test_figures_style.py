"""The figure house style: deterministic SVG with real text, and the phone-legibility arithmetic."""
import pytest

from labkit import figures as F


def _fig(fontsize=None, width=5.0):
    fig, ax = F.new(width, 2.5)
    ax.plot([0, 1], [1, 2])
    ax.text(0.5, 1.5, "label", fontsize=fontsize)
    return fig


def test_svg_is_deterministic_and_has_text():
    a, b = F.svg(_fig()), F.svg(_fig())
    assert a == b
    assert "<text" in a and "Date" not in a


def test_smallest_label_scales_with_the_column():
    s = F.svg(_fig())
    phone, desk = F.smallest_label_px(s), F.smallest_label_px(s, 800)
    assert desk == pytest.approx(9.5 * 4 / 3)           # 9.5 pt ticks at full size
    assert F.MIN_LABEL_PX <= phone < desk                # scaled down to the phone column, still legible


def test_a_tiny_label_is_caught():
    assert F.smallest_label_px(F.svg(_fig(fontsize=5))) < F.MIN_LABEL_PX


def test_too_wide_is_refused():
    with pytest.raises(ValueError, match="width 8"):
        F.new(8, 3)

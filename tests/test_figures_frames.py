"""labkit.figures.frames: the moving pictures' frames end in the collective's definition and send
the bytes labkit.calc.comm counts."""
import pytest

from labkit.calc import comm
from labkit.figures import frames as F

pytestmark = pytest.mark.quick
BYTES = {"all_gather": comm.all_gather_bytes, "reduce_scatter": comm.reduce_scatter_bytes,
         "all_reduce": comm.ring_all_reduce_bytes}


@pytest.mark.parametrize("n", [2, 3, 4, 5, 8])
@pytest.mark.parametrize("op", F.RING_OPS)
def test_ring_frames_end_in_the_definition(op, n):
    out = F.ring_frames(op, n)["frames"]
    everyone = list(range(n))
    last = out[-1]["cells"]
    for r in range(n):
        for c in range(n):
            if op == "reduce_scatter":     # rank r holds the full sum of its own chunk r only
                assert (last[r][c] == everyone) == (c == r)
            elif op == "all_gather":       # every rank holds chunk c, which came from rank c
                assert last[r][c] == [c]
            else:
                assert last[r][c] == everyone
    assert len(out) == 1 + (2 if op == "all_reduce" else 1) * (n - 1)
    assert out[-1]["sent"] == pytest.approx(BYTES[op](1.0, n))
    for f in out[1:]:                      # one chunk per rank per step, each to its right neighbour
        assert sorted(r for r, _ in f["sending"]) == everyone


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
@pytest.mark.parametrize("n", [2, 4, 6])
def test_zero_frames_send_what_calc_counts_and_keep_the_shards(stage, n):
    out = F.zero_frames(stage, n, param_bytes=10.0)["frames"]
    assert out[-1]["sent"] == pytest.approx(sum(comm.dp_step_bytes(10.0, n, stage, 10.0, 1).values()))
    start, end = out[0]["ranks"], out[-1]["ranks"]
    for r in range(n):
        for state, sharded_from in (("optim", 1), ("grads", 2), ("weights", 3)):
            assert len(start[r][state]) == (1 if stage >= sharded_from else n)
    assert all(len(end[r]["weights"]) == (1 if stage == 3 else n) for r in range(n))


def test_bad_arguments():
    with pytest.raises(ValueError):
        F.ring_frames("broadcast", 4)
    with pytest.raises(ValueError):
        F.ring_frames("all_reduce", 1)
    with pytest.raises(ValueError):
        F.zero_frames(4)


def test_landing_page_axes_figure_is_current():
    """book/_static/moving/axes.svg (book/intro.md) is what labkit.figures.axes draws today."""
    from pathlib import Path

    import matplotlib
    matplotlib.use("Agg")
    from labkit.figures import axes, smallest_label_px, svg
    drawn = svg(axes.fig_axes())
    stored = (Path(__file__).resolve().parent.parent / "book" / "_static" / "moving" / "axes.svg").read_text()
    assert stored == drawn, "redraw it: python -c \"from labkit.figures import axes, svg; ...\""
    assert smallest_label_px(drawn) >= 9.0

"""Every figure function of labkit/figures (``fig_*`` in each chapter module) draws, in the house
style: vector SVG with real text, deterministic, no label under 9 CSS px on a 390 px phone or at
1400 px; and the pipeline and DDP timelines cover every event of every panel (the regression for
the clipped 1F1B figure: ``plt.subplots(sharex=True)`` + ``set_xlim`` per panel cut the longer
schedule). Inputs of figures that draw measured runs come from tests/figure_examples.py."""
import importlib
import inspect
import pkgutil

import matplotlib
import pytest

matplotlib.use("Agg")

import labkit.figures as F                                    # noqa: E402
from figure_examples import EXAMPLES, overlap_out             # noqa: E402

DESK_COLUMN_PX = 800.0   # the book's content column at a 1400 px window is wider than any figure


def _figure_functions():
    out = []
    for info in pkgutil.iter_modules(F.__path__):
        if info.name == "style" or info.name.startswith("_"):
            continue
        mod = importlib.import_module(f"labkit.figures.{info.name}")
        for name, fn in inspect.getmembers(mod, inspect.isfunction):
            if name.startswith("fig_") and fn.__module__ == mod.__name__:
                out.append((f"{info.name}.{name}", mod, fn))
    return out


FUNCTIONS = _figure_functions()


def _draw(key, mod, fn):
    return EXAMPLES[key](mod) if key in EXAMPLES else fn()


def _digests() -> dict:
    """{key: sha256 of the SVG} for every figure, drawn in this process."""
    import hashlib

    import matplotlib.pyplot as plt
    out = {}
    for key, mod, fn in FUNCTIONS:
        out[key] = hashlib.sha256(F.svg(_draw(key, mod, fn)).encode()).hexdigest()
        plt.close("all")
    return out


@pytest.fixture(scope="module")
def other_process():
    """The same digests from another Python process with another string-hash seed: a figure that
    depends on set or dict-of-set order (as nbval, re-running the notebook, would see) differs."""
    import os
    import subprocess
    import sys
    code = ("import json, sys; sys.path.insert(0, 'tests'); import matplotlib; matplotlib.use('Agg');"
            "import test_figures_book as t; print(json.dumps(t._digests()))")
    env = dict(os.environ, PYTHONHASHSEED="12345")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    done = subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    import json
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_every_chapter_module_has_three_figures():
    per_module = {}
    for key, _, _ in FUNCTIONS:
        per_module.setdefault(key.split(".")[0], []).append(key)
    for chapter in ("collectives", "data_parallel", "tensor_parallel", "sequence_parallel",
                    "context_parallel", "pipeline", "expert_parallel", "ptdp"):
        assert len(per_module.get(chapter, [])) >= 3, (chapter, per_module.get(chapter))


def test_examples_name_real_functions():
    keys = {key for key, _, _ in FUNCTIONS}
    assert set(EXAMPLES) <= keys, set(EXAMPLES) - keys


@pytest.mark.parametrize("key,mod,fn", FUNCTIONS, ids=[k for k, _, _ in FUNCTIONS])
def test_figure_is_legible_vector_and_deterministic(key, mod, fn, other_process):
    import hashlib

    import matplotlib.pyplot as plt
    text = F.svg(_draw(key, mod, fn))
    plt.close("all")
    assert hashlib.sha256(text.encode()).hexdigest() == other_process[key], \
        "the same inputs must give the same SVG in any process (nbval compares it)"
    assert "<text" in text and "<image" not in text, "vector, with real text"
    phone, desk = F.smallest_label_px(text), F.smallest_label_px(text, DESK_COLUMN_PX)
    assert phone >= F.MIN_LABEL_PX, f"{key}: smallest label {phone:.2f} px on a 390 px screen"
    assert desk >= F.MIN_LABEL_PX, f"{key}: smallest label {desk:.2f} px at 1400 px"


def _covers(ax, events) -> bool:
    lo, hi = ax.get_xlim()
    return lo <= min(e.start for e in events) + 1e-9 and hi >= max(e.end for e in events) - 1e-9


def test_render_on_shared_axes_covers_every_panel():
    """The chapter's old pattern, kept working: two render() calls on sharex panels, the longer
    schedule second or first; the shared x-range covers every event of both."""
    import matplotlib.pyplot as plt

    from labkit.pipeline_parallel import schedules as S
    from labkit.pipeline_parallel.plot import render
    from labkit.pipeline_parallel.simulate import simulate
    long_, short = simulate(S.one_f_one_b(4, 8)), simulate(S.interleaved(4, 2, 8), 0.5, 1.0)
    assert long_.makespan > short.makespan
    for order in ((long_, short), (short, long_)):
        fig, axes = plt.subplots(2, 1, sharex=True)
        for ax, sim in zip(axes, order):
            render(sim, ax=ax)
        for ax, sim in zip(axes, order):
            assert _covers(ax, sim.timeline)
        plt.close(fig)


def test_fig_timelines_covers_every_panel():
    import matplotlib.pyplot as plt

    from labkit.figures.pipeline import fig_timelines
    from labkit.pipeline_parallel import schedules as S
    from labkit.pipeline_parallel.simulate import simulate
    sims = [simulate(S.interleaved(4, 2, 8), 0.5, 1.0), simulate(S.one_f_one_b(4, 8)),
            simulate(S.zb_h1(4, 8), 1.0, 2.0, 1.0)]
    fig = fig_timelines([(str(i), s) for i, s in enumerate(sims)])
    for ax in fig.axes:
        for sim in sims:
            assert _covers(ax, sim.timeline)
    plt.close(fig)


def test_dp_overlap_covers_every_bar_of_both_panels():
    """measure/dp_plot.py: the naive and bucketed panels share one x-range covering every phase
    and every all-reduce of both (the example's bucketed run ends 30 ms after the naive one)."""
    import matplotlib.pyplot as plt

    from labkit.measure.dp_plot import MIN_BAR_MS, plot_overlap
    out = overlap_out()
    axes = plot_overlap(out)
    ends = [t1 for run in out.values() for _, _, t1 in run["phases"]]
    ends += [t0 + max(t1 - t0, MIN_BAR_MS) for run in out.values() for _, t0, t1 in run["all_reduce"]]
    for ax in axes:
        lo, hi = ax.get_xlim()
        assert lo <= 0 and hi >= max(ends)
    plt.close("all")


def legend_covers(fig) -> list[str]:
    """Labels of the lines (markers, and segments sampled 25 times) that an axes' own legend box
    lies on: issue 36, defect 10 (the bubble plots' legends sat on their lines)."""
    import numpy as np
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    hit = []
    for ax in fig.axes:
        if ax.get_legend() is None:
            continue
        box = ax.get_legend().get_window_extent(renderer).shrunk(0.98, 0.9)
        for line in ax.get_lines():
            xy = line.get_transform().transform(line.get_xydata())
            pts = [xy]
            if line.get_linestyle() not in ("None", "", " ") and len(xy) > 1:
                t = np.linspace(0, 1, 25)[:, None]
                pts += [a + t * (b - a) for a, b in zip(xy[:-1], xy[1:])]
            p = np.vstack(pts)
            p = p[np.isfinite(p).all(axis=1)]
            if np.any((p[:, 0] > box.x0) & (p[:, 0] < box.x1) & (p[:, 1] > box.y0) & (p[:, 1] < box.y1)):
                hit.append(line.get_label())
    return hit


def test_legend_detector_finds_a_covered_line():
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots()
    ax.plot([0, 1], [0, 1], label="diagonal")
    ax.legend(loc="center")
    assert legend_covers(fig) == ["diagonal"]
    ax.legend(loc="lower right")
    assert legend_covers(fig) == []
    plt.close(fig)


@pytest.mark.parametrize("key, mod, fn", FUNCTIONS, ids=[k for k, _, _ in FUNCTIONS])
def test_no_legend_covers_a_line(key, mod, fn):
    import matplotlib.pyplot as plt
    covered = legend_covers(_draw(key, mod, fn))
    plt.close("all")
    assert not covered, f"{key}: the legend lies on {covered}: move it outside the axes or to a free corner"

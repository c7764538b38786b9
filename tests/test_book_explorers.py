"""The explorers' build-time side (book/_ext/): data the pages run on, answers, directives, theme.

No browser (tests/test_browser_book.py drives the pages): the pipeline grid decodes to exactly the
simulator's timelines, the answers are labkit.calc's, a bad directive option fails the build with
its allowed range, and the theme trimming keeps what a page needs. Tier 1, plus one small Sphinx
build (a few seconds).
"""
from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

import labkit.calc as calc
from labkit.pipeline_parallel import schedules
from labkit.pipeline_parallel.simulate import simulate

ROOT = Path(__file__).resolve().parent.parent
EXT = ROOT / "book" / "_ext"
sys.path.insert(0, str(EXT))
answers = pytest.importorskip("labkit_answers")
explorers = pytest.importorskip("labkit_explorers", reason="the book tools (docutils, Sphinx) are not installed")


def decode(case):
    """The page's decoding (pipeline.js decode), in Python: (rank, action, start, end) per action."""
    out = []
    for rank, text in enumerate(case["ranks"]):
        t = 0.0
        for tok in text.split():
            if tok[0] == "+":
                t += float(tok[1:])
                continue
            out.append((rank, tok, t, t + case["costs"][tok[0]]))
            t += case["costs"][tok[0]]
    return sorted(out)


@pytest.mark.parametrize("name, p, m, v", [("gpipe", 3, 5, 1), ("1f1b", 4, 8, 1), ("1f1b", 8, 3, 1),
                                           ("interleaved", 4, 8, 2), ("interleaved", 2, 6, 3),
                                           ("zb-h1", 4, 8, 1), ("zb-h1", 5, 2, 1)])
def test_encoded_schedule_is_the_simulated_one(name, p, m, v):
    case = explorers.encode_case(name, p, m, v)
    sched = {"gpipe": lambda: schedules.gpipe(p, m), "1f1b": lambda: schedules.one_f_one_b(p, m),
             "zb-h1": lambda: schedules.zb_h1(p, m), "interleaved": lambda: schedules.interleaved(p, v, m)}[name]()
    sim = simulate(sched)
    assert decode(case) == sorted((e.rank, str(e.action), e.start, e.end) for e in sim.timeline)
    assert case["makespan"] == sim.makespan and case["peak_in_flight"] == sim.peak_in_flight
    assert case["bubble"] == sim.bubble_fraction


def test_grid_covers_every_choice_and_keeps_the_rules():
    grid = explorers.pipeline_grid()
    cases = grid["cases"]
    for name in explorers.SCHEDULES:
        for p in explorers.P_RANGE:
            for m in explorers.M_RANGE:
                for v in (explorers.V_RANGE[1:] if name == "interleaved" else (1,)):
                    assert explorers.case_key(name, p, m, v) in cases
    with pytest.raises(ValueError) as err:
        schedules.interleaved(4, 2, 6)
    assert cases["interleaved/4/6/2"] == {"error": str(err.value)}
    assert len(json.dumps(grid)) < 400_000          # the page fetches it whole


def test_memory_answer_is_labkit_calc():
    v = {**answers.MEMORY_DEFAULTS, "recompute_granularity": "full", "attention": "math", "virtual_stages": 2}
    got = answers.memory(v)
    model, par, prec = answers.memory_configs(v)
    assert par.world_size == 8 * 16 * 8 and par.num_layers_per_virtual_pipeline_stage == 3
    rows = calc.memory_per_stage(model, par, prec, attention="math")
    assert [r["total"] for r in got["stages"]] == [r["total"] for r in rows]
    est = calc.megatron_estimate(par.world_size, **calc.flops.megatron_kwargs(model, par))
    assert got["megatron"]["activation_bytes"] == est["activation_bytes"]
    assert got["megatron"]["formula"] == "without SP"
    assert any("no case for full recompute" in line for line in got["megatron"]["why"])


def test_memory_answer_names_the_rule():
    got = answers.memory({**answers.MEMORY_DEFAULTS, "model": "gpt2-1.5b", "tensor_model_parallel_size": 2,
                          "pipeline_model_parallel_size": 1})
    assert got["error"].startswith("rule:") and "25" in got["error"]
    got = answers.memory({**answers.MEMORY_DEFAULTS, "virtual_stages": 4})     # 6 layers per stage
    assert "divisible" in got["error"]


def test_megatron_why_follows_megatrons_two_formulas():
    model, par, prec = answers.memory_configs(answers.MEMORY_DEFAULTS)       # SP + selective
    lines = answers.megatron_why(model, par, prec, "flash", 1.0, 1.0)
    assert not any("falls back" in x for x in lines)
    lines = answers.megatron_why(model, par.with_(recompute_granularity=None), prec, "flash", 1.0, 1.0)
    assert any("falls back to its without-SP formula" in x for x in lines)
    lines = answers.megatron_why(model, par.with_(context_parallel_size=2, world_size=2048), prec, "flash", 1, 1)
    assert any("context parallelism" in x for x in lines)


def test_single_changes_answer_each_control_value():
    cache = answers.memory_single_changes(answers.MEMORY_DEFAULTS)
    for name, _label, choices in answers.MEMORY_CONTROLS:
        for value in choices:
            key = answers.key({**answers.MEMORY_DEFAULTS, name: value})
            assert key in cache
    some = answers.key({**answers.MEMORY_DEFAULTS, "tensor_model_parallel_size": 4})
    assert cache[some] == answers.memory({**answers.MEMORY_DEFAULTS, "tensor_model_parallel_size": 4})


def test_calculators_say_what_is_wrong_in_words():
    assert answers.calculate("batch", {"world_size": ""}) == {"error": "'GPUs' is empty: type a number"}
    assert "whole number" in answers.calculate("batch", {"world_size": 8.5})["error"]
    assert "no inputs ['bogus']" in answers.calculate("batch", {"bogus": 1})["error"]
    # a negative step time is a typo, not "no step time" (0): say so instead of dropping it
    assert "step_time must be a positive" in answers.calculate("memory", {"step_time": -1.0})["error"]
    assert "mfu" in answers.calculate("memory", {"step_time": 10.0})
    assert answers.calculate("batch", {"world_size": 64.0, "global_batch_size": 64})["data_parallel_size"] == 64
    assert answers.key({"a": 0.0, "b": 1.5, "c": True}) == '{"a":0,"b":1.5,"c":true}'   # as JavaScript writes it


def test_calculator_answers_are_raw_numbers():
    a = answers.calculate("memory", {})
    assert isinstance(a["flops_per_iteration"], float) and a["flops_per_iteration"] > 1e18
    m = calc.model("gpt3-175b")
    assert a["flops_per_iteration"] == calc.model_flops_per_iteration(
        m, calc.ParallelConfig(world_size=1024, tensor_model_parallel_size=8, pipeline_model_parallel_size=16,
                               global_batch_size=1536, sequence_parallel=True, use_distributed_optimizer=True,
                               zero_stage=1, recompute_granularity="selective"))
    assert {f[0] for f in answers.forms()["memory"]} >= {"attention", "model", "world_size"}


def test_theme_icons_come_from_the_theme_and_searches_stay_on_search():
    theme = pytest.importorskip("labkit_theme")
    import pydata_sphinx_theme
    fa = Path(pydata_sphinx_theme.__file__).parent / "theme" / "pydata_sphinx_theme" / "static" / "scripts" / "fontawesome.js"
    if not fa.exists():
        pytest.skip(f"no {fa}")
    icons = theme.solid_icons(fa.read_text())
    for name in ("bars", "magnifying-glass", "moon", "sun", "circle-half-stroke", "list", "download"):
        w, h, path = icons[name]
        assert w > 0 and h == 512 and path.startswith("M")
    css = theme.icons_css({"bars"}, icons)
    assert ".fa-bars" in css and "data:image/svg+xml" in css and "<" not in css.split("*/", 1)[1]


def test_theme_finish_rewrites_pages(tmp_path):
    theme = pytest.importorskip("labkit_theme")
    static = tmp_path / "_static"
    (static / "scripts").mkdir(parents=True)
    (static / "jupyter-widgets").mkdir()
    (static / "scripts" / "fontawesome.js").write_text('var p={bars:[448,512,[],"f0c9","M0 96z"]};d("fas",p)')
    head = ('<script defer src="_static/scripts/fontawesome.js?digest=1"></script>\n'
            '<script src="_static/searchtools.js"></script>\n<script src="searchindex.js"></script>\n'
            '<i class="fa-solid fa-bars"></i>')
    (tmp_path / "page.html").write_text(head)
    (tmp_path / "search.html").write_text(head)

    class App:
        outdir = str(tmp_path)

        class builder:
            format = "html"

    theme.finish(App, None)
    page, search = (tmp_path / "page.html").read_text(), (tmp_path / "search.html").read_text()
    assert "fontawesome.js" not in page and "searchindex" not in page and "fa-bars" in page
    assert "searchindex.js" in search and "fontawesome.js" not in search
    assert ".fa-bars" in (static / "labkit-icons.css").read_text()
    assert not (static / "jupyter-widgets").exists() and not (static / "scripts" / "fontawesome.js").exists()


def _sphinx(tmp_path, body: str):
    (tmp_path / "conf.py").write_text(
        f"import sys; sys.path.insert(0, {str(EXT)!r})\n"
        "extensions = ['myst_parser', 'labkit_explorers']\nmyst_enable_extensions = ['colon_fence']\n")
    (tmp_path / "index.md").write_text("# Test\n\n" + body)
    return subprocess.run([sys.executable, "-m", "sphinx", "-b", "html", "-W", "-q", str(tmp_path),
                           str(tmp_path / "out")], capture_output=True, text=True, timeout=120)


def test_directive_builds_and_refuses_bad_options(tmp_path):
    pytest.importorskip("myst_parser")
    ok = _sphinx(tmp_path / "ok", "```{labkit-explorer} pipeline\n:schedule: interleaved\n:p: 4\n:m: 8\n:v: 2\n"
                 ":caption: Stepper.\n```\n\n```{labkit-explorer} memory\n:tp: 4\n:attention: math\n```\n\n"
                 "```{labkit-explorer} rank-grid\n:world_size: 32\n:tp: 4\n```\n") if (tmp_path / "ok").mkdir() is None else None
    assert ok.returncode == 0, ok.stderr
    html = (tmp_path / "ok" / "out" / "index.html").read_text()
    assert html.count('class="labkit-explorer"') == 3 and "explorers/explorers.js" in html
    assert (tmp_path / "ok" / "out" / "_static" / "explorers" / "pipeline.json").exists()
    (tmp_path / "bad").mkdir()
    bad = _sphinx(tmp_path / "bad", "```{labkit-explorer} pipeline\n:p: 12\n```\n")
    assert bad.returncode != 0 and "between 2 and 8" in bad.stderr
    (tmp_path / "rule").mkdir()
    rule = _sphinx(tmp_path / "rule", "```{labkit-explorer} pipeline\n:schedule: interleaved\n:p: 4\n:m: 6\n```\n")
    assert rule.returncode != 0 and "multiple of pipeline size" in rule.stderr


def test_why_parallelism_figures_are_legible_and_deterministic():
    from labkit import figures
    from labkit.figures import why_parallelism as W
    n = calc.total_params(calc.model("gpt3-175b"))
    for make in (W.memory_anatomy, W.activations_by_layout, lambda: W.zero_stages(n)):
        a, b = figures.svg(make()), figures.svg(make())
        assert a == b
        assert figures.smallest_label_px(a) >= figures.MIN_LABEL_PX
    # the numbers drawn are labkit.calc's: the totals written beside the anatomy bars
    svg = figures.svg(W.memory_anatomy("gpt2-1.5b", 8))
    row = calc.memory_per_stage(calc.model("gpt2-1.5b"), calc.ParallelConfig(micro_batch_size=8),
                                calc.MIXED_18, attention="flash")[0]
    assert f"{row['total'] / 2**30:,.1f}" in svg
    assert not math.isnan(row["total"])

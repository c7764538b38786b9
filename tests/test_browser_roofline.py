"""The roofline explorer and the moving pictures in headless Chromium, at 1400 and 390 px (issue 36).

* the roofline explorer (book/roofline.html) shows, for random layouts (non-powers of two
  included), the intensities, times, bounds, link ratios and crossovers that ``labkit.calc.roofline``
  computes here in Python, and names the rule a bad layout breaks;
* the players (ring collectives in book/collectives.html, the ZeRO stages in book/data-parallel.html)
  advance when played, step with the buttons, and honour ``prefers-reduced-motion``: no autoplay and
  no CSS transitions, while the step buttons still work.

Same switch as tests/test_browser_book.py (``LABKIT_BROWSER_BOOK=1``, after a book build); run
alone with ``-k roofline`` or ``-k player``.
"""
from __future__ import annotations

import os
import random

import pytest

import labkit.calc as calc
from labkit.calc import roofline as rl
from test_browser_book import HTML, ROOT, STEP, site  # noqa: F401  (the served book)

pytestmark = [pytest.mark.browser, pytest.mark.skipif(
    os.environ.get(STEP) != "1", reason=f"after the book build: {STEP}=1 python -m pytest tests/test_browser_roofline.py")]
WIDTHS = (1400, 390)


def _open(site, page, width, reduced=False):
    browser, base = site
    for f in (ROOT / "book" / "_static" / "moving").iterdir():      # the build runs these copies
        built = HTML / "_static" / "moving" / f.name
        if not built.exists() or built.read_bytes() != f.read_bytes():
            pytest.fail(f"the built book carries an old copy of book/_static/moving/{f.name}: rebuild it")
    ctx = browser.new_context(viewport={"width": width, "height": 900},
                              reduced_motion="reduce" if reduced else "no-preference")
    pg = ctx.new_page()
    pg.errors = []
    pg.on("pageerror", lambda e: pg.errors.append(str(e)))
    pg.on("console", lambda m: m.type == "error" and pg.errors.append(m.text))
    pg.set_default_timeout(120_000)        # a loaded 2-core machine: slow, not broken
    pg.goto(base + page, wait_until="load")
    return pg


def _set(box, name, value):
    field = box.locator(f'[name="{name}"]')
    kind = field.evaluate("e => e.tagName + ':' + (e.type || '')")
    if kind.startswith("SELECT"):
        field.select_option(str(value))
    elif kind.endswith("checkbox"):
        field.set_checked(bool(value))
    else:
        field.fill(str(value))


def _layouts(n=5, seed=36):
    """Random valid layouts of the explorer's models; sizes that are not powers of two included."""
    rnd = random.Random(seed)
    out = [dict(model="gpt3-175b", gpu="dgx-a100", s=2048, b=2, m=3, tp=6, cp=1, ep=1, dp=5, fsdp=False),
           dict(model="mixtral-8x7b", gpu="dgx-b200", s=6144, b=1, m=2, tp=2, cp=3, ep=4, dp=4, fsdp=True)]
    while len(out) < n:
        name = rnd.choice(["llama3-8b", "llama3-70b", "gpt3-175b", "deepseek-moe-16b"])
        m = calc.model(name)
        tp = rnd.choice([t for t in range(1, 13) if m.num_attention_heads % t == 0 and m.query_groups % t == 0])
        cp = rnd.choice([1, 2, 3, 5])
        s = 2 * cp * rnd.choice([512, 1000, 2048])
        dp = rnd.choice([1, 2, 3, 7, 12])
        ep = rnd.choice([e for e in (1, 2, 4, 8) if m.num_experts and m.num_experts % e == 0 and (cp * dp) % e == 0] or [1])
        out.append(dict(model=name, gpu=rnd.choice(["dgx-a100", "dgx-h100", "dgx-h200", "dgx-b200"]), s=s,
                        b=rnd.choice([1, 2, 3]), m=rnd.choice([1, 4, 6]), tp=tp, cp=cp, ep=ep, dp=dp,
                        fsdp=rnd.random() < 0.5))
    return out


def _expected(v):
    """What labkit.calc.roofline says for the explorer's inputs ``v``."""
    cluster = calc.CLUSTERS[v["gpu"]]
    gpu = cluster.gpu
    model = calc.model(v["model"]).with_(seq_length=v["s"])
    layout = {"tp": v["tp"], "cp": v["cp"], "ep": v["ep"], ("fsdp" if v["fsdp"] else "dp"): v["dp"]}
    links = rl.layout_links(cluster, layout)
    ops = {o.name: (o.intensity, rl.op_time(o, gpu.peak_flops, gpu.hbm_bandwidth),
                    rl.bound(o, gpu.peak_flops, gpu.hbm_bandwidth))
           for o in rl.layer_ops(model, v["tp"], v["cp"], v["b"], ep=v["ep"])}
    cross = {}
    for o in rl.comm_ops(model, layout, v["b"], num_microbatches=v["m"]):
        bw = links[o.memory][0]
        ops[o.name] = (o.intensity, rl.op_time(o, gpu.peak_flops, bw), rl.bound(o, gpu.peak_flops, bw))
        n = layout[o.memory]
        cross[o.memory] = (rl.crossover(o.memory, n, gpu.peak_flops, bw, swiglu=model.swiglu,
                                        kv_ratio=model.query_groups / model.num_attention_heads),
                           (o.bytes / bw) / (o.flops / gpu.peak_flops))
    return ops, cross


@pytest.mark.parametrize("width", WIDTHS)
def test_roofline_explorer_equals_labkit_calc(site, width):  # noqa: F811
    pg = _open(site, "book/roofline.html", width)
    box = pg.locator("figure.labkit-roofline").first
    for v in _layouts():
        for key in ("gpu", "model", "s", "b", "m", "tp", "cp", "ep", "dp", "fsdp"):
            _set(box, key, v[key])
        assert box.get_attribute("data-error") == "", (v, box.get_attribute("data-error"))
        ops, cross = _expected(v)
        shown = box.locator("table.rl-ops tbody tr").evaluate_all(
            "rows => rows.map(r => [r.dataset.op, +r.dataset.intensity, +r.dataset.time, r.dataset.bound])")
        assert sorted(s[0] for s in shown) == sorted(ops), v
        for name, intensity, time, bound in shown:
            assert intensity == pytest.approx(ops[name][0], rel=1e-9), (v, name)
            assert time == pytest.approx(ops[name][1], rel=1e-9), (v, name)
            assert bound == ops[name][2], (v, name)
        rows = box.locator("table.rl-cross tbody tr").evaluate_all(
            "rows => rows.map(r => [r.dataset.axis, +r.dataset.crossover, +r.dataset.ratio])")
        assert {r[0] for r in rows} == set(cross), v
        for axis, x, ratio in rows:
            assert x == pytest.approx(cross[axis][0], rel=1e-9), (v, axis)
            assert ratio == pytest.approx(cross[axis][1], rel=1e-9), (v, axis)
    assert not pg.errors, pg.errors
    pg.context.close()


@pytest.mark.parametrize("width", WIDTHS)
def test_roofline_explorer_moves_ops_and_names_broken_rules(site, width):  # noqa: F811
    pg = _open(site, "book/roofline.html", width)
    box = pg.locator("figure.labkit-roofline").first
    where = lambda name: box.locator(f'g.rl-op[data-op="{name}"]').get_attribute("transform")  # noqa: E731
    _set(box, "model", "llama3-70b")
    _set(box, "s", 8192)
    _set(box, "cp", 1)
    before = where("qkv")
    _set(box, "cp", 8)                   # 1/8 of the tokens: the GEMMs slide left, the ring appears
    assert where("qkv") != before
    assert box.locator('tr[data-op="CP ring K/V"]').get_attribute("data-bound") == "link"
    _set(box, "tp", 5)                   # 64 heads: TP 5 is not a divisor
    assert "TP = 5" in box.get_attribute("data-error")
    assert "TP = 5" in box.locator(".lx-status").inner_text()
    _set(box, "tp", 8)
    assert box.get_attribute("data-error") == ""
    assert not pg.errors, pg.errors
    pg.context.close()


def _frame(fig) -> int:
    return int(fig.get_attribute("data-frame"))


@pytest.mark.parametrize("width", WIDTHS)
def test_player_frames_advance_when_played(site, width):  # noqa: F811
    pg = _open(site, "book/collectives.html", width)
    players = pg.locator("figure.labkit-player")
    assert players.count() == 3
    fig = players.nth(2)                 # the all-reduce: 6 steps
    fig.locator(".mv-step").click()
    assert _frame(fig) == 1
    text = fig.locator(".mv-text").inner_text()
    fig.locator(".mv-back").click()
    assert _frame(fig) == 0 and fig.locator(".mv-text").inner_text() != text
    fig.locator(".mv-play").click()
    pg.wait_for_function("f => +f.dataset.frame >= 2", arg=fig.element_handle(), timeout=60_000)
    assert pg.evaluate("() => getComputedStyle(document.querySelector('.labkit-player .mv-cell rect')).transitionDuration") != "0s"
    zero = _open(site, "book/data-parallel.html", width)
    fz = zero.locator("figure.labkit-player").first
    fz.locator(".mv-stage").select_option("3")
    assert _frame(fz) == 0
    for _ in range(3):
        fz.locator(".mv-step").click()
    assert _frame(fz) == 3 and "Reduce-scatter" in fz.locator(".mv-text").inner_text()
    assert not pg.errors and not zero.errors, pg.errors + zero.errors
    pg.context.close()
    zero.context.close()


@pytest.mark.parametrize("width", WIDTHS)
def test_player_honours_reduced_motion(site, width):  # noqa: F811
    pg = _open(site, "book/collectives.html", width, reduced=True)
    fig = pg.locator("figure.labkit-player").first
    fig.scroll_into_view_if_needed()
    pg.wait_for_timeout(2500)            # autoplay would have moved two frames by now
    assert _frame(fig) == 0 and not fig.get_attribute("data-playing")
    assert pg.evaluate("() => getComputedStyle(document.querySelector('.labkit-player .mv-cell rect')).transitionDuration") == "0s"
    fig.locator(".mv-step").click()
    assert _frame(fig) == 1
    assert not pg.errors, pg.errors
    pg.context.close()
    moving = _open(site, "book/collectives.html", width)      # motion welcome: it starts when seen
    f2 = moving.locator("figure.labkit-player").first
    f2.scroll_into_view_if_needed()
    moving.wait_for_function("f => +f.dataset.frame >= 1", arg=f2.element_handle(), timeout=60_000)
    moving.context.close()

"""The static calculator page (book/calculators.md) in headless Chromium: labkit.calc in Pyodide.

Serves the built book (``_build/html``) on 127.0.0.1 with a free port, changes inputs, and checks
the numbers the page shows equal labkit.calc's, computed here in Python; that the page fetched
nothing from outside 127.0.0.1; and that the console shows no JavaScript error. Skipped with a
reason when Chromium (Debian package ``chromium``), Playwright, or the built book is missing.
"""
from __future__ import annotations

import functools
import http.server
import threading
from pathlib import Path
from urllib.parse import urlparse

import pytest

import labkit.calc as calc
from labkit.calc.report import _model, _parallel, defaults

ROOT = Path(__file__).resolve().parent.parent
HTML = ROOT / "_build" / "html"
PAGE = HTML / "book" / "calculators.html"
CHROMIUM = Path("/usr/bin/chromium")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]
GIB = 2 ** 30

pytestmark = pytest.mark.browser


def _requirements():
    if not CHROMIUM.exists():
        return "no /usr/bin/chromium: apt-get install -y chromium"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "Playwright for Python is not installed (pip install -r requirements.txt)"
    if not PAGE.exists() or not (HTML / "_static" / "labkit_src" / "manifest.json").exists():
        return "the book is not built: run `jupyter-book build . -W -n --keep-going` first"
    return None


def _stale_sources() -> list[str]:
    """labkit files whose copy in the built book differs from the working tree."""
    import json
    src = HTML / "_static" / "labkit_src"
    files = json.loads((src / "manifest.json").read_text())["files"]
    return [f for f in files if (src / f).read_bytes() != (ROOT / f).read_bytes()]


class _Handler(http.server.SimpleHTTPRequestHandler):
    extensions_map = {**http.server.SimpleHTTPRequestHandler.extensions_map,
                      ".wasm": "application/wasm", ".mjs": "text/javascript", ".js": "text/javascript"}

    def log_message(self, *args):  # keep pytest output clean
        pass


@pytest.fixture(scope="module")
def page():
    reason = _requirements()
    if reason:
        pytest.skip(reason)
    stale = _stale_sources()
    if stale:  # the page would run old formulas: a real mismatch, not a missing tool
        pytest.fail(f"the built book carries old copies of {stale}: rebuild it with "
                    f"`jupyter-book build . -W -n --keep-going` before running this test")
    from playwright.sync_api import sync_playwright
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Handler, directory=str(HTML)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    errors, outside = [], []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=FLAGS, headless=True)
        pg = browser.new_page()
        pg.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        pg.on("pageerror", lambda e: errors.append(str(e)))

        def route(r):
            if urlparse(r.request.url).hostname != "127.0.0.1":
                outside.append(r.request.url)
                return r.abort()
            return r.continue_()

        pg.route("**/*", route)
        pg.goto(f"http://127.0.0.1:{server.server_address[1]}/book/calculators.html")
        pg.wait_for_selector("#labkit-calc-status[data-state=ready]", timeout=120_000)
        pg.errors, pg.outside = errors, outside
        yield pg
        browser.close()
    server.shutdown()


def _set(pg, calc_name, values: dict):
    """Set inputs of one calculator and wait until its answer has been recomputed."""
    box = pg.locator(f'.labkit-calc[data-calc="{calc_name}"]')
    for name, value in values.items():
        before = box.get_attribute("data-updates")
        field = box.locator(f'[name="{name}"]')
        if isinstance(value, bool):
            field.set_checked(value)
        elif field.evaluate("e => e.tagName") == "SELECT":
            field.select_option(str(value))
        else:
            field.fill(str(value))
        pg.wait_for_function("([sel, n]) => document.querySelector(sel).dataset.updates !== n",
                             arg=[f'.labkit-calc[data-calc="{calc_name}"]', before])
    return box


def _shown(box, key) -> float:
    return float(box.locator(f'[data-key="{key}"]').inner_text().replace(",", ""))


def test_page_starts_python_offline(page):
    assert page.locator("#labkit-calc-status").get_attribute("data-state") == "ready"
    assert page.outside == [], f"fetched from outside: {page.outside}"


def test_batch_numbers_equal_labkit_calc(page):
    v = {"model": "gpt3-175b", "world_size": 64, "tensor_model_parallel_size": 4,
         "pipeline_model_parallel_size": 4, "micro_batch_size": 2, "global_batch_size": 256}
    box = _set(page, "batch", v)
    model, par = _model({**defaults("batch"), **v}), _parallel({**defaults("batch"), **v})
    b = calc.batch_math(model, par)
    assert _shown(box, "data_parallel_size") == b["data_parallel_size"] == 4
    assert _shown(box, "num_microbatches") == b["num_microbatches"] == 32
    assert _shown(box, "tokens_per_step") == b["tokens_per_step"]
    assert _shown(box, "bubble") == round(calc.bubble_fraction(4, 32), 4)


def test_invalid_layout_shows_the_rule(page):
    box = _set(page, "batch", {"tensor_model_parallel_size": 5})
    text = box.locator('[data-key="error"]').inner_text()
    assert "world_size divisible by TP*PP*CP" in text and "64" in text
    box = _set(page, "batch", {"tensor_model_parallel_size": 4})
    assert box.locator('[data-key="error"]').count() == 0


@pytest.mark.parametrize("changes", [
    {"pipeline_model_parallel_size": 8, "recompute_granularity": "full", "cluster": "dgx-h100"},
    {"model": "llama3-70b", "world_size": 512, "tensor_model_parallel_size": 8,
     "pipeline_model_parallel_size": 4, "global_batch_size": 512, "zero_stage": "3", "seq_length": 4096},
])
def test_memory_numbers_equal_labkit_calc(page, changes):
    box = _set(page, "memory", changes)
    v = {**defaults("memory"), **_current(box)}
    model, par = _model(v), _parallel(v)
    rows = calc.memory_per_stage(model, par, calc.PRECISIONS[v["precision"]])
    for r in (rows[0], rows[-1]):
        for k in ("params", "grads", "optimizer", "activations", "total"):
            assert _shown(box, f"stage{r['stage']}_{k}") == round(r[k] / GIB, 3), (r["stage"], k)
    est = calc.megatron_estimate(par.world_size, **calc.flops.megatron_kwargs(model, par))
    assert _shown(box, "megatron_weight_mb") == round(est["weight_and_optimizer_bytes"] / 2**20, 2)
    assert _shown(box, "megatron_activation_mb") == round(est["activation_bytes"] / 2**20, 2)
    assert _shown(box, "flops") == pytest.approx(calc.model_flops_per_iteration(model, par), rel=1e-4)
    c = calc.CLUSTERS[v["cluster"]]
    t = calc.step_time(model, par, c.with_(nodes=par.world_size // c.gpus_per_node), calc.PRECISIONS[v["precision"]])
    assert _shown(box, "step_time") == round(t["step_time"], 3)


def _current(box) -> dict:
    out = {}
    for el in box.locator("input, select").all():
        kind, name = el.get_attribute("data-kind"), el.get_attribute("name")
        out[name] = (el.is_checked() if kind == "bool" else int(el.input_value()) if kind == "int"
                     else float(el.input_value()) if kind == "float" else el.input_value())
    return out


def test_planner_count_equals_labkit_calc(page):
    box = _set(page, "planner", {"nodes": 64})
    v = {**defaults("planner"), **_current(box)}
    result = calc.plan(_model(v), calc.cluster(v["cluster"], 64), v["global_batch_size"],
                       recompute=("selective", "full"))
    assert _shown(box, "n_fit") == len(result["ranked"]) > 0
    assert _shown(box, "plan0_tokens_per_s") == round(result["ranked"][0]["tokens_per_s"])


def test_no_javascript_errors(page):
    assert page.errors == [], page.errors

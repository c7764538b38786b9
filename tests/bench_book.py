"""Benchmark of the rendered book as a reader meets it: weight and speed of every page.

    python tests/bench_book.py                  # every page of _build/html, headless Chromium
    python tests/bench_book.py --pages book/calculators.html,book/why-parallelism.html
    python tests/bench_book.py --json bench_results/book.json

Serves the built book (``jupyter-book build .`` first) from 127.0.0.1 and opens each page in a fresh
browser context (cold cache), at 1400 px. Per page:

* bytes of every response while the page loads, uncompressed and gzip-compressed (level 6, what a
  static host sends with ``Content-Encoding: gzip``), split into figures (images) and the rest:
  issue 19's budget is <= 1 MB compressed per chapter page, figures excluded (what the interactions
  below fetch afterwards, Python for the memory explorer, is reported apart);
* first contentful paint (ms after navigation start);
* each explorer's first answer (ms after navigation start, and relative to the load event: negative
  means on screen before the page finished loading);
* on pages with a memory explorer or calculators: the time from a change that the build did not
  precompute to its answer, with Python (Pyodide, in a Web Worker) cold, then warm; on the
  calculators page also the time from opening it to the answer of a change made at once.

Prints a Markdown table (and the machine's load average: these are timings on a shared 2-core
machine). Not a test: tests/test_browser_book.py checks correctness; this measures.
"""
from __future__ import annotations

import argparse
import functools
import gzip
import http.server
import json
import os
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]


class Handler(http.server.SimpleHTTPRequestHandler):
    extensions_map = {**http.server.SimpleHTTPRequestHandler.extensions_map, ".wasm": "application/wasm",
                      ".mjs": "text/javascript", ".js": "text/javascript", ".svg": "image/svg+xml"}

    def log_message(self, *args):
        pass


def serve(html: Path):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Handler, directory=str(html)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/"


def pages_of(html: Path) -> list[str]:
    out = []
    for folder in ("book", "labs"):
        out += sorted(p.relative_to(html).as_posix() for p in (html / folder).glob("*.html"))
    return out


def is_figure(url: str, ctype: str) -> bool:
    return "/_images/" in url or (ctype.startswith("image/") and "/_static/" not in url)


def measure(browser, base: str, page: str, interact: bool = True) -> dict:
    ctx = browser.new_context(viewport={"width": 1400, "height": 900})
    sizes = {}

    def on_response(resp):
        try:
            body = resp.body()
        except Exception:   # redirects, aborted requests
            return
        ctype = (resp.headers.get("content-type") or "").split(";")[0]
        sizes[resp.url] = (len(body), len(gzip.compress(body, 6)), is_figure(resp.url, ctype))

    ctx.on("response", on_response)
    pg = ctx.new_page()
    pg.goto(base + page, wait_until="load")
    try:   # a page that starts Python at once (the calculators) keeps fetching for a while
        pg.wait_for_load_state("networkidle", timeout=180_000)
    except Exception:  # noqa: BLE001 - measure what has arrived
        pass
    timing = pg.evaluate("""() => {
        const nav = performance.getEntriesByType('navigation')[0];
        const fcp = performance.getEntriesByType('paint').find(e => e.name === 'first-contentful-paint');
        const boxes = [...document.querySelectorAll('figure.labkit-explorer, .labkit-calc')];
        return {load: nav.loadEventStart, fcp: fcp ? fcp.startTime : null,
                explorers: boxes.map(b => [b.dataset.explorer || (b.dataset.play ? 'player ' + b.dataset.play :
                                           b.classList.contains('labkit-roofline') ? 'roofline' : 'calculator ' + b.dataset.calc),
                                           b.dataset.firstAnswerMs ? +b.dataset.firstAnswerMs : null])};
    }""")
    out = {"page": page, "fcp_ms": timing["fcp"], "load_ms": timing["load"],
           "explorers": [{"kind": k, "first_answer_ms": t, "after_load_ms": None if t is None else t - timing["load"]}
                         for k, t in timing["explorers"]]}
    time.sleep(0.3)   # responses still being read
    loaded = dict(sizes)   # what reading the page costs; interactions below may fetch more (Python)
    fig = [v for v in loaded.values() if v[2]]
    rest = [v for v in loaded.values() if not v[2]]
    out.update(requests=len(loaded), figures=len(fig), figure_bytes=sum(v[0] for v in fig),
               raw_bytes=sum(v[0] for v in loaded.values()), gzip_bytes=sum(v[1] for v in loaded.values()),
               gzip_bytes_no_figures=sum(v[1] for v in rest))
    if interact:
        out.update(interactions(pg, page))
        time.sleep(0.3)
        out["interaction_gzip_bytes"] = sum(v[1] for k, v in sizes.items() if k not in loaded)
    ctx.close()
    return out


def _time_change(pg, box_sel: str, action, counter: str, timeout=120_000) -> float:
    """ms from doing ``action`` to the box's ``counter`` attribute changing (an answer shown)."""
    before = pg.eval_on_selector(box_sel, f"b => b.dataset.{counter} || ''")
    t0 = time.perf_counter()
    action()
    pg.wait_for_function(f"([s, n]) => (document.querySelector(s).dataset.{counter} || '') !== n",
                         arg=[box_sel, before], timeout=timeout)
    pg.wait_for_function(f"s => document.querySelector(s).dataset.state === 'ready'", arg=box_sel, timeout=timeout)
    return (time.perf_counter() - t0) * 1e3


def interactions(pg, page: str) -> dict:
    out = {}
    if pg.locator("figure[data-explorer=memory]").count():
        sel = "figure[data-explorer=memory]"
        box = pg.locator(sel).first
        # two controls moved: not precomputed, so Python answers (cold, then warm)
        box.locator("[name=recompute_granularity]").select_option("full")
        out["memory_change_cold_ms"] = _time_change(
            pg, sel, lambda: box.locator("[name=attention]").select_option("math"), "answered")
        out["memory_change_warm_ms"] = _time_change(
            pg, sel, lambda: box.locator("[name=precision]").select_option("fp32"), "answered")
        out["python_start_ms"] = pg.evaluate("window.labkitExplorers.pythonStartMs")
    if pg.locator("figure[data-explorer=pipeline]").count():
        sel = "figure[data-explorer=pipeline]"
        box = pg.locator(sel).first
        t0 = time.perf_counter()
        box.locator("[name=schedule]").select_option("zb-h1")
        pg.wait_for_function("s => document.querySelector(s).dataset.case.startsWith('zb-h1')", arg=sel)
        out["pipeline_change_ms"] = (time.perf_counter() - t0) * 1e3
    return out


def calculators_open_to_change(browser, base: str) -> dict:
    """Open the calculators page and change an input at once (one the build did not precompute):
    ms from navigation start until that answer is shown, and when Python was ready."""
    ctx = browser.new_context(viewport={"width": 1400, "height": 900})
    pg = ctx.new_page()
    t0 = time.perf_counter()
    pg.goto(base + "book/calculators.html", wait_until="domcontentloaded")
    sel = '.labkit-calc[data-calc="batch"]'
    box = pg.locator(sel)
    before = box.get_attribute("data-updates")
    cached = time.perf_counter()
    box.locator("[name=model]").select_option("llama3-8b")          # precomputed: answered at once
    pg.wait_for_function("([s, n]) => document.querySelector(s).dataset.updates !== n", arg=[sel, before])
    cached_ms = (time.perf_counter() - cached) * 1e3
    box.locator("[name=world_size]").fill("96")                      # not precomputed: Python answers
    box.locator("[name=world_size]").press("Enter")
    pg.wait_for_function("s => { const b = document.querySelector(s); return b.dataset.state === 'ready' "
                         "&& b.dataset.inputs.includes('\"world_size\":96'); }", arg=sel, timeout=180_000)
    out = {"open_to_uncached_answer_ms": (time.perf_counter() - t0) * 1e3, "cached_change_ms": cached_ms,
           "python_start_ms": pg.evaluate("window.labkitExplorers.pythonStartMs")}
    ctx.close()
    return out


def pyodide_cold_start(browser, base: str, runs: int) -> dict:
    """Python's start in the page's Web Worker, cold (fresh context: no cache, no compiled wasm),
    ``runs`` times on the calculators page (which starts it at once): ms from navigation start to
    ready, and inside the worker (load Pyodide, write labkit's sources, import nothing yet)."""
    page_ms, worker_ms = [], []
    for _ in range(runs):
        ctx = browser.new_context()
        pg = ctx.new_page()
        pg.goto(base + "book/calculators.html", wait_until="domcontentloaded")
        pg.wait_for_function("() => window.labkitExplorers && window.labkitExplorers.pythonReadyMs",
                             timeout=300_000)
        page_ms.append(pg.evaluate("window.labkitExplorers.pythonReadyMs"))
        worker_ms.append(pg.evaluate("window.labkitExplorers.pythonStartMs"))
        ctx.close()
    med = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
    return {"runs": runs, "ready_after_navigation_ms": page_ms, "median_ready_ms": med(page_ms),
            "median_worker_ms": med(worker_ms)}


def kb(x):
    return f"{x / 1024:,.0f}"


def table(rows: list, extra: dict) -> str:
    lines = ["| page | figures (KB) | requests | raw KB | gzip KB | gzip KB w/o figures | first paint ms | "
             "explorers: first answer ms after load | interactions |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ex = "; ".join(f"{e['kind']} " + ("not drawn" if e["after_load_ms"] is None else f"{e['after_load_ms']:+.0f}")
                       for e in r["explorers"]) or "-"
        inter = "; ".join(f"{k.replace('_ms', '')} {v:,.0f}" for k, v in r.items()
                          if k.endswith("_ms") and k not in ("fcp_ms", "load_ms") and v is not None) or "-"
        if r.get("interaction_gzip_bytes", 0) >= 1024:
            inter += f"; then fetched {kb(r['interaction_gzip_bytes'])} KB gzip (Python)"
        lines.append(f"| {r['page']} | {r['figures']} ({kb(r['figure_bytes'])}) | {r['requests']} | "
                     f"{kb(r['raw_bytes'])} | {kb(r['gzip_bytes'])} | {kb(r['gzip_bytes_no_figures'])} | "
                     f"{r['fcp_ms']:.0f} | {ex} | {inter} |")
    if extra:
        lines.append("")
        lines.append("calculators page, change made at once after opening: " + ", ".join(
            f"{k.replace('_ms', '')} {v:,.0f} ms" for k, v in extra.items() if v is not None))
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--html", type=Path, default=ROOT / "_build" / "html")
    ap.add_argument("--pages", help="comma-separated pages relative to the html folder (default: all)")
    ap.add_argument("--json", type=Path, help="also write the rows as JSON here")
    ap.add_argument("--no-interact", action="store_true", help="skip the Python-backed interactions")
    ap.add_argument("--pyodide-runs", type=int, default=3, help="cold starts of Python to time (0: none)")
    args = ap.parse_args(argv)
    if not (args.html / "book" / "intro.html").exists():
        sys.exit(f"no built book in {args.html}: run `jupyter-book build . -W -n --keep-going` first")
    from playwright.sync_api import sync_playwright
    server, base = serve(args.html)
    pages = args.pages.split(",") if args.pages else pages_of(args.html)
    rows, extra = [], {}
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS, headless=True)
        for page in pages:
            rows.append(measure(browser, base, page, not args.no_interact))
            print(f"measured {page}", file=sys.stderr)
        if not args.no_interact and "book/calculators.html" in pages:
            extra = calculators_open_to_change(browser, base)
        cold = pyodide_cold_start(browser, base, args.pyodide_runs) if args.pyodide_runs else None
        browser.close()
    server.shutdown()
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores, Chromium headless, cold cache\n")
    print(table(rows, extra))
    if cold:
        print(f"\nPython (Pyodide) cold start in the Web Worker, {cold['runs']} runs: ready "
              f"{', '.join(f'{x:,.0f}' for x in cold['ready_after_navigation_ms'])} ms after navigation "
              f"(median {cold['median_ready_ms']:,.0f}; inside the worker {cold['median_worker_ms']:,.0f})")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"rows": rows, "calculators": extra, "pyodide": cold,
                                         "loadavg": os.getloadavg()}, indent=1))


if __name__ == "__main__":
    main()

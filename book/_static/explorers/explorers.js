// The book's explorers: what they share (formatting, controls, the Python worker) and mount().
// Each explorer is a <figure class="labkit-explorer" data-explorer="KIND" data-config="{...}"> written
// by the labkit-explorer directive (book/_ext/labkit_explorers.py), followed by an inline
// labkitExplorers.mount(id): it draws at once, from data computed when the book was built, so the
// first answer is on screen at first paint. pipeline.js, memory.js and rankgrid.js register the kinds.
(function () {
  "use strict";
  const script = document.currentScript;
  const base = new URL(".", script.src).href;                 // .../_static/explorers/
  const reduceMotion = window.matchMedia && window.matchMedia("(prefers-reduced-motion: reduce)");

  // -- numbers as a reader reads them -----------------------------------------------------------
  const GIB = 2 ** 30, MIB = 2 ** 20;
  function bytes(x) {
    if (!isFinite(x)) return String(x);
    if (Math.abs(x) >= 1024 * GIB) return (x / 1024 / GIB).toFixed(2) + " TiB";
    if (Math.abs(x) >= GIB) return (x / GIB).toFixed(Math.abs(x) >= 100 * GIB ? 1 : 2) + " GiB";
    if (Math.abs(x) >= MIB) return (x / MIB).toFixed(1) + " MiB";
    if (Math.abs(x) >= 1024) return (x / 1024).toFixed(1) + " KiB";
    return Math.round(x) + " B";
  }
  function flops(x) {
    const units = [[1e18, "EFLOP"], [1e15, "PFLOP"], [1e12, "TFLOP"], [1e9, "GFLOP"]];
    for (const [u, name] of units) if (Math.abs(x) >= u) return (x / u).toFixed(2) + " " + name;
    return x.toExponential(2) + " FLOP";
  }
  function seconds(x) {
    if (Math.abs(x) < 1) return (x * 1e3).toFixed(1) + " ms";
    return x.toFixed(2) + " s";
  }
  const percent = (x, digits = 1) => (100 * x).toFixed(digits) + "%";
  const integer = (x) => Math.round(x).toLocaleString("en-US");

  // -- DOM helpers ----------------------------------------------------------------------------
  function h(tag, attrs, ...children) {
    const el = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === undefined || v === null || v === false) continue;
      if (k === "class") el.className = v;
      else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
      else if (k === "dataset") Object.assign(el.dataset, v);
      else el.setAttribute(k, v === true ? "" : v);
    }
    for (const c of children.flat()) if (c !== null && c !== undefined && c !== false) el.append(c);
    return el;
  }
  const SVGNS = "http://www.w3.org/2000/svg";
  function s(tag, attrs, ...children) {
    const el = document.createElementNS(SVGNS, tag);
    for (const [k, v] of Object.entries(attrs || {})) if (v !== undefined && v !== null) el.setAttribute(k, v);
    for (const c of children.flat()) if (c !== null && c !== undefined) el.append(c);
    return el;
  }
  // A number shown to the reader: formatted text, the exact value in data-value (the browser test
  // compares it with labkit), a stable data-key.
  function num(key, value, format) {
    return h("span", { class: "lx-num", dataset: { key, value: String(value) } }, format(value));
  }

  // A caption is written for the explorer's first setting: once the reader changes it, the caption
  // says so (and that the numbers shown are for the reader's setting), so it never reads as stale.
  function captionNote(fig, changed) {
    const cap = fig.querySelector("figcaption");
    if (!cap) return;
    let note = cap.querySelector(".lx-caption-note");
    if (!note) {
      note = h("span", { class: "lx-caption-note", hidden: true },
               " (This caption describes the first setting; what is drawn above is for the setting you chose.)");
      cap.append(note);
    }
    note.hidden = !changed;
    fig.dataset.changed = changed ? "1" : "";
  }

  let uid = 0;
  // A slider over a list of values (keyboard: arrows, Home/End, PageUp/Down); shows the value.
  function choiceSlider(name, label, choices, value, onchange, show = String) {
    const id = "lx-c" + (++uid);
    let index = Math.max(0, choices.indexOf(value));
    const out = h("output", { for: id, class: "lx-value" }, show(choices[index]));
    const input = h("input", { id, type: "range", min: 0, max: choices.length - 1, step: 1, value: index,
                               name, "aria-valuetext": show(choices[index]), "data-choices": JSON.stringify(choices) });
    input.addEventListener("input", () => {
      index = +input.value;
      out.textContent = show(choices[index]);
      input.setAttribute("aria-valuetext", show(choices[index]));
      onchange(choices[index]);
    });
    const wrap = h("div", { class: "lx-control" }, h("label", { for: id }, label), input, out);
    wrap.set = (v) => { index = Math.max(0, choices.indexOf(v)); input.value = index; out.textContent = show(v);
                        input.setAttribute("aria-valuetext", show(v)); };
    wrap.input = input;
    return wrap;
  }
  function choiceSelect(name, label, choices, value, onchange, show = String) {
    const id = "lx-c" + (++uid);
    const sel = h("select", { id, name }, choices.map((c) => h("option", { value: String(c), selected: c === value }, show(c))));
    sel.addEventListener("change", () => onchange(choices[sel.selectedIndex]));
    // a menu with a long choice ("deepseek-moe-16b") takes two grid columns: on a phone, the width
    // of the explorer, so its text never runs under the arrow
    const long = Math.max(...choices.map((c) => show(c).length)) > 13;
    const wrap = h("div", { class: "lx-control" + (long ? " lx-wide" : "") }, h("label", { for: id }, label), sel);
    wrap.set = (v) => { sel.selectedIndex = Math.max(0, choices.indexOf(v)); };
    wrap.input = sel;
    return wrap;
  }
  // A whole number typed by the reader (any value in [min, max], not a menu of powers of two).
  // onchange(x) gets the number, or onchange(null, message) while the field holds no valid value.
  function intInput(name, label, value, onchange, { min = 1, max = 1e6 } = {}) {
    const id = "lx-c" + (++uid);
    const input = h("input", { id, name, type: "number", min, max, step: 1, value: String(value), inputmode: "numeric" });
    const read = () => {
      const text = input.value.trim();
      if (input.validity && input.validity.badInput) return [null, `${label} must be a number`];
      if (text === "") return [null, `${label} is empty: type a whole number`];
      const x = Number(text);
      if (!Number.isInteger(x)) return [null, `${label} must be a whole number, got ${text}`];
      if (x < min || x > max) return [null, `${label} must be between ${min} and ${max}, got ${x}`];
      return [x, null];
    };
    const fire = () => { const [x, err] = read(); input.setAttribute("aria-invalid", err ? "true" : "false"); onchange(x, err); };
    input.addEventListener("input", fire);
    input.addEventListener("change", fire);
    const wrap = h("div", { class: "lx-control lx-int" }, h("label", { for: id }, label), input);
    wrap.set = (v) => { input.value = String(v); };
    wrap.input = input;
    return wrap;
  }
  function checkbox(name, label, value, onchange) {
    const id = "lx-c" + (++uid);
    const box = h("input", { id, type: "checkbox", name, checked: !!value });
    box.addEventListener("change", () => onchange(box.checked));
    const wrap = h("div", { class: "lx-control lx-check" }, box, h("label", { for: id }, label));
    wrap.set = (v) => { box.checked = !!v; };
    wrap.input = box;
    return wrap;
  }

  // Run fn at most once per animation frame with the latest arguments (drags redraw smoothly).
  function perFrame(fn) {
    let pending = null;
    return (...args) => {
      const first = pending === null;
      pending = args;
      if (first) requestAnimationFrame(() => { const a = pending; pending = null; fn(...a); });
    };
  }
  function debounce(fn, ms) {
    let timer = null;
    return (...args) => { clearTimeout(timer); timer = setTimeout(() => fn(...args), ms); };
  }

  // -- the Python worker (labkit.calc in Pyodide), shared by every explorer of the page ---------
  // Started on demand (the first answer the build did not precompute), so a page that only reads
  // does not download Python. Answers are {id, answer} messages; one request in flight per caller.
  // Progress while it starts is broadcast as a "labkit-python" event on window ({detail: {state,
  // text, ms}}: state "starting" | "ready" | "failed"), and kept in api.pythonState.
  let worker = null, workerReady = null, nextId = 0;
  const waiting = new Map();
  const FILE_HINT = "this page was opened from a file (file://), where browsers refuse to start Python: "
    + "serve the book over http (python -m http.server -d _build/html) and open it there";
  function python() {
    if (window.location.protocol === "file:") return Promise.reject(new Error(FILE_HINT));
    if (!worker) {
      worker = new Worker(base + "calc-worker.js", { type: "module" });
      workerReady = new Promise((resolve, reject) => {
        worker.addEventListener("message", (e) => {
          const msg = e.data;
          if (msg.progress) { progress("starting", msg.progress); return; }
          if (msg.ready) { api.pythonReadyMs = performance.now(); api.pythonStartMs = msg.ms; progress("ready", "Python ready"); resolve(msg); return; }
          if (msg.failed) { progress("failed", msg.failed); reject(new Error(msg.failed)); return; }
          const done = waiting.get(msg.id);
          if (done) { waiting.delete(msg.id); done(msg); }
        });
        worker.addEventListener("error", (e) => { progress("failed", e.message || "the Python worker failed");
                                                   reject(new Error(e.message || "the Python worker failed")); });
      });
      progress("starting", "starting Python");
    }
    return workerReady;
  }
  let pythonT0 = null;
  function progress(state, text) {
    if (pythonT0 === null) pythonT0 = performance.now();
    const ms = performance.now() - pythonT0;
    api.pythonState = { state, text, ms };
    api.pythonLog.push({ state, text, at: performance.now() });   // read by tests/test_browser_book.py
    window.dispatchEvent(new CustomEvent("labkit-python", { detail: api.pythonState }));
  }
  // Start Python once the page has painted and the browser is idle (never at open): the answers
  // the build precomputed are on screen at once, and Python is warm by the time a reader types an
  // input the build did not answer. Pages without a Python-backed explorer never call this.
  let idleAsked = false;
  function warmOnIdle() {
    if (idleAsked || window.location.protocol === "file:") return;
    idleAsked = true;
    const go = () => (window.requestIdleCallback || ((f) => setTimeout(f, 200)))(() => python().catch(() => {}), { timeout: 3000 });
    if (document.readyState === "complete") go(); else window.addEventListener("load", go, { once: true });
  }
  // The status text of Python's start, for a status line: "" once ready.
  function pythonText(st) {
    if (!st) return "";
    if (st.state === "starting") return `starting Python in your browser: ${st.text} (${(st.ms / 1000).toFixed(1)} s) ...`;
    if (st.state === "failed") return "Python could not start in this browser: " + st.text;
    return "";
  }
  async function ask(name, values) {
    await python();
    const id = ++nextId;
    return new Promise((resolve) => {
      waiting.set(id, resolve);
      worker.postMessage({ id, name, values });
    });
  }
  const pythonStarted = () => worker !== null;

  const kinds = {};
  function mount(id) {
    const fig = document.getElementById(id);
    if (!fig || fig.dataset.mounted) return;
    const kind = kinds[fig.dataset.explorer];
    const body = fig.querySelector(".lx-body");
    const dataEl = fig.querySelector("script.lx-data");
    const data = dataEl ? JSON.parse(dataEl.textContent) : null;
    const config = JSON.parse(fig.dataset.config);
    fig.dataset.mounted = "1";
    try {
      body.replaceChildren();
      kind(fig, body, config, data);
      fig.dataset.firstAnswerMs = performance.now().toFixed(1);   // read by tests/bench_book.py
    } catch (err) {
      body.replaceChildren(h("p", { class: "lx-error" }, "This explorer failed to start: " + err));
      console.error(err);
    }
  }

  const api = window.labkitExplorers = {
    base, kinds, mount, FILE_HINT, h, s, num, bytes, flops, seconds, percent, integer, choiceSlider,
    choiceSelect, checkbox, intInput, captionNote, perFrame, debounce, ask, python, pythonStarted, warmOnIdle, pythonText,
    pythonState: null, pythonLog: [],
    reduceMotion: () => !!(reduceMotion && reduceMotion.matches),
  };
})();

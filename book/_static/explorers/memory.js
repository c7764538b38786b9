// Memory explorer: bytes per GPU for every pipeline stage (weights, gradients, optimizer states,
// activations) as stacked bars redrawn while you drag, the GPU's memory as a line, the rule a layout
// breaks, and Megatron-LM's own estimate with the formula it used. Every number is labkit.calc's
// (book/_ext/labkit_answers.py): the page's inputs and every change of one input were answered when
// the book was built (inline, and memory-<hash>.json); any other input is answered by the same
// function in a Web Worker running Pyodide, started the first time it is needed.
(function () {
  "use strict";
  const X = window.labkitExplorers;
  const { h, s, num, bytes } = X;
  const PARTS = [["params", "weights", "#4c72b0"], ["grads", "gradients", "#dd8452"],
                 ["optimizer", "optimizer states", "#55a868"], ["activations", "activations", "#c44e52"]];
  const SELECTS = new Set(["model", "recompute_granularity", "precision", "attention", "gpu", "zero_stage"]);
  // typed whole numbers, any value (24 GPUs, PP 3, TP 5): Python answers what the build did not
  const NUMBERS = { seq_length: 1 << 20, micro_batch_size: 4096, tensor_model_parallel_size: 1024,
                    pipeline_model_parallel_size: 1024, virtual_stages: 128, context_parallel_size: 1024,
                    expert_model_parallel_size: 1024, data_parallel_size: 1 << 20, num_microbatches: 1 << 20 };
  const SHOW = { attention: (x) => (x === "flash" ? "flash (fused)" : "materialized s×s"),
                 recompute_granularity: String, zero_stage: (x) => (x === 0 ? "0 (none)" : x === 1 ? "1 (distributed optimizer)" : String(x)) };
  const key = (v) => JSON.stringify(Object.keys(v).sort().reduce((o, k) => ((o[k] = v[k]), o), {}));

  // Stacked bars per pipeline stage, the GPU's memory as a dashed line; [svg, legend]. Drawn at the
  // box's own width in CSS px (1 SVG unit = 1 px), so labels keep their size on a phone.
  function memoryBars(a, width) {
    const n = a.stages.length;
    const pick = n <= 16 ? a.stages.map((_, i) => i) : [0, 1, 2, 3, 4, 5, 6, 7, -1, n - 4, n - 3, n - 2, n - 1];
    const maxTotal = Math.max(a.capacity_bytes, ...a.stages.map((r) => r.total)) * 1.04;
    const W = Math.max(280, Math.round(width || 600)), left = 58, right = 74, row = 20, top = 6, legendH = 24;
    const H = top + pick.length * row + legendH;
    const x = (b) => left + (W - left - right) * b / maxTotal;
    const svg = s("svg", { viewBox: `0 0 ${W} ${H}`, width: W, height: H, class: "lx-memsvg", role: "img",
      "aria-label": `bytes per GPU for ${n} pipeline stages; peak ${bytes(a.peak_bytes)}; GPU memory ${bytes(a.capacity_bytes)}` });
    pick.forEach((i, j) => {
      const y = top + j * row;
      if (i < 0) { svg.append(s("text", { x: 4, y: y + 14, class: "lx-tick" }, `stages 8–${n - 5} lie between`)); return; }
      const r = a.stages[i];
      svg.append(s("text", { x: 4, y: y + 14, class: "lx-tick" }, `stage ${i}`));
      let at = 0;
      for (const [k, label, colour] of PARTS) {
        const w = x(at + r[k]) - x(at);
        if (w > 0) svg.append(s("rect", { x: x(at), y: y + 3, width: w, height: row - 6, fill: colour, "data-key": `stage${i}_${k}`, "data-value": r[k] },
                                  s("title", null, `stage ${i} ${label}: ${bytes(r[k])}`)));
        at += r[k];
      }
      svg.append(s("text", { x: x(r.total) + 4, y: y + 14, class: "lx-tick", "data-key": `stage${i}_total`, "data-value": r.total }, bytes(r.total)));
    });
    const cx = x(a.capacity_bytes), bottom = top + pick.length * row;
    svg.append(s("line", { x1: cx, x2: cx, y1: top, y2: bottom, class: "lx-capacity" }),
               s("text", { x: Math.min(cx, W - 70), y: bottom + 14, class: "lx-tick", "text-anchor": "middle" }, `GPU ${bytes(a.capacity_bytes)}`));
    return [svg, h("p", { class: "lx-legend" }, PARTS.map(([k, label, colour]) =>
      h("span", null, h("span", { class: "lx-swatch", style: `background:${colour}` }), label + " ")),
      h("span", null, h("span", { class: "lx-swatch lx-dash" }), "GPU memory"))];
  }

  X.memoryBars = memoryBars;

  X.kinds.memory = function (fig, body, config, data) {
    const values = { ...config.values };
    const cache = new Map([[data.key, data.answer]]);
    let cacheLoad = null, shown = null, asked = 0;
    const status = h("p", { class: "lx-status", role: "status", "aria-live": "polite" });
    const derived = h("p", { class: "lx-derived" });
    const summary = h("p", { class: "lx-summary" });
    const bars = h("div", { class: "lx-bars" });
    const megatron = h("div", { class: "lx-megatron" });

    const controls = h("div", { class: "lx-controls lx-controls-memory" });
    const ctl = {};
    const bad = new Map();     // field -> what is wrong with its text (an empty or non-integer field)
    for (const [name, label, choices] of config.controls) {
      const show = SHOW[name] || String;
      const onchange = (x) => { values[name] = x; update(); };
      const typed = (x, err) => { if (err) bad.set(name, err); else { bad.delete(name); values[name] = x; } update(); };
      ctl[name] = typeof choices[0] === "boolean" ? X.checkbox(name, label, values[name], onchange)
        : name in NUMBERS ? X.intInput(name, label, values[name], typed, { min: 1, max: NUMBERS[name] })
        : SELECTS.has(name) ? X.choiceSelect(name, label, choices, values[name], onchange, show)
        : X.choiceSlider(name, label, choices, values[name], onchange, show);
      controls.append(ctl[name]);
    }
    body.append(controls, derived, status, summary, bars, megatron);

    function loadCache() {
      if (!cacheLoad) {
        cacheLoad = fetch(X.base + config.cache).then((r) => r.json()).then((all) => {
          for (const [k, a] of Object.entries(all)) cache.set(k, a);
        }).catch(() => {});
      }
      return cacheLoad;
    }
    // On a chapter page Python (6-7 MB gzip) starts only when a reader first reaches for a control:
    // the page answers any layout at once from the closed form (memory-formula.js) and Python adds
    // Megatron's estimate when it is ready; a page that is only read never downloads it. The
    // calculators page warms it on idle (calculators.js). Its progress shows in the status line.
    const warm = () => { loadCache(); X.python().catch(() => {}); };
    controls.addEventListener("pointerdown", warm, { once: true });
    controls.addEventListener("focusin", warm, { once: true });
    window.addEventListener("labkit-python", (e) => {
      fig.dataset.python = e.detail.state;
      if (fig.dataset.state === "computing" && e.detail.state !== "ready") status.textContent = X.pythonText(e.detail);
      if (shown && !shown.error && !shown.megatron && e.detail.state !== "ready") {
        const p = megatron.querySelector("p");
        if (p) p.lastChild.textContent = X.pythonText(e.detail);
      }
    });

    // One question to Python at a time: while it computes, drags only update `values`; when the
    // answer comes, the latest values are asked next (if the answer is not already theirs).
    let busy = false;
    const update = X.perFrame(async () => {
      if (bad.size) {                                        // say what is wrong; nothing to compute
        ++asked;
        const [name, err] = [...bad][0];
        fig.dataset.state = "invalid"; fig.dataset.inputs = "";
        status.textContent = "";
        summary.replaceChildren(h("span", { class: "lx-error", dataset: { key: "error" } }, `invalid input — ${err}`));
        bars.classList.add("lx-stale"); megatron.replaceChildren(); derived.replaceChildren();
        X.captionNote(fig, true);
        return;
      }
      const snap = { ...values }, k = key(snap);
      const mine = ++asked;
      // at once: labkit.calc's closed form transcribed in the page (memory-formula.js); the build's
      // or Python's full answer (with Megatron's estimate) replaces it when it comes
      if (!cache.has(k) && data.formula && X.memoryClosedForm) {
        const t = performance.now(), a = X.memoryClosedForm(data.formula, snap);
        show(a, `closed form computed in the page in ${(performance.now() - t).toFixed(1)} ms; `
                + "labkit.calc (Python) checks it and adds Megatron-LM's estimate ...", k, "closed-form");
      }
      if (!cache.has(k)) await loadCache();
      if (mine !== asked) return;                            // a newer input overtook this one
      if (cache.has(k)) { show(cache.get(k), "answer computed when the book was built", k); return; }
      if (fig.dataset.state !== "closed-form") {
        fig.dataset.state = "computing";
        const py = X.pythonState;
        status.textContent = py && py.state === "ready" ? "computing in your browser ..."
          : X.pythonText(py) || "computing: starting Python in your browser (a few seconds, the first time) ...";
        summary.classList.add("lx-stale"); bars.classList.add("lx-stale");
      }
      if (busy) return;                                      // the answer in flight will ask again
      busy = true;
      let reply;
      try { reply = await X.ask("memory-explorer", snap); }
      catch (err) { busy = false; status.textContent = "Python could not start in this browser: " + err.message; fig.dataset.state = "failed"; return; }
      busy = false;
      cache.set(k, reply.answer);
      if (key(values) === k && !bad.size) show(reply.answer, `computed in your browser by labkit.calc in ${reply.ms.toFixed(0)} ms`, k);
      else update();                                         // the reader moved on meanwhile
    });

    function show(a, how, k, state = "ready") {
      shown = a;
      X.captionNote(fig, k !== data.key);
      fig.dataset.state = state;
      fig.dataset.source = state === "closed-form" ? "page" : how.startsWith("answer computed when") ? "build" : "python";
      fig.dataset.answered = String(+(fig.dataset.answered || 0) + 1);
      fig.dataset.inputs = k;
      status.textContent = how;
      summary.classList.remove("lx-stale"); bars.classList.remove("lx-stale");
      const world = values.tensor_model_parallel_size * values.pipeline_model_parallel_size
        * values.context_parallel_size * values.data_parallel_size;
      derived.replaceChildren(`GPUs = TP × PP × CP × DP = ${world.toLocaleString("en-US")}; global batch = m × b × DP = `
        + (values.num_microbatches * values.micro_batch_size * values.data_parallel_size).toLocaleString("en-US")
        + ` sequences of ${values.seq_length.toLocaleString("en-US")} tokens`);
      if (a.error) {
        summary.replaceChildren(h("span", { class: "lx-error", dataset: { key: "error" } }, "invalid layout — " + a.error));
        bars.classList.add("lx-stale"); megatron.replaceChildren();
        return;
      }
      const fits = a.peak_bytes <= a.capacity_bytes;
      summary.replaceChildren("peak ", num("peak", a.peak_bytes, bytes), ` per GPU (stage ${a.peak_stage} of ${a.stages.length}): `,
        h("b", { class: fits ? "lx-fits" : "lx-nofit" }, fits ? "fits" : "does not fit"),
        ` in the ${a.gpu}'s `, num("capacity", a.capacity_bytes, bytes), `. ${a.attention}.`,
        ...a.warnings.map((w) => h("span", { class: "lx-warning" }, " " + w)));
      bars.replaceChildren(...memoryBars(a, bars.clientWidth));
      const m = a.megatron;
      if (!m) {   // the closed form in the page has no Megatron estimate: Python brings it
        megatron.replaceChildren(h("p", null, "Megatron-LM's own estimate, and why it differs: labkit.calc computes it "
          + "in Python in your browser; ", X.pythonText(X.pythonState) || "on its way ..."));
        return;
      }
      megatron.replaceChildren(
        h("p", null, "Megatron-LM's own estimate (first stage, ", h("code", null, "theoretical_memory_usage.py"), "): weights and optimizer ",
          num("megatron_weight", m.weight_and_optimizer_bytes, bytes), ", activations ", num("megatron_activation", m.activation_bytes, bytes),
          " — its ", h("b", null, m.formula === "without SP" ? "without-SP formula, sbh(10 + 24/t) per layer + 5%"
                                                           : "SP + selective formula, sbh(18 + 4·ffn/h)/t per layer"),
          ". labkit's stage 0: ", num("stage0_activations", a.stages[0].activations, bytes), " of activations. Why they differ:"),
        h("ul", null, m.why.map((line) => h("li", null, line))));
    }

    new ResizeObserver(X.perFrame(() => { if (shown && !shown.error) bars.replaceChildren(...memoryBars(shown, bars.clientWidth)); })).observe(bars);
    show(data.answer, "answer computed when the book was built; change any control", data.key);
  };
})();

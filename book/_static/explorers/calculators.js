// The calculators page: forms of labkit.calc inputs (labkit.calc.report.FORMS) and their answers.
// The answers for the default inputs, and for many single changes, were computed when the book was
// built (the labkit-calculator directive, book/_ext/labkit_explorers.py): they are on screen at first
// paint. Python (Pyodide, in a Web Worker: the page stays responsive) starts in the background once
// the page is idle after its first paint, and answers everything else with the same function, book/_ext/labkit_answers.py's calculate().
// Typing is debounced; an empty field says so; numbers are formatted (GiB, TFLOP, ms) and carry their
// exact value in data-value for the browser test.
(function () {
  "use strict";
  const X = window.labkitExplorers;
  const { h, num, bytes, flops, seconds, percent, integer } = X;
  const TYPING_MS = 350;
  const t0 = performance.now();

  function status(text, state) {
    const el = document.getElementById("labkit-calc-status");
    if (el) { el.textContent = text; el.dataset.state = state; }
  }
  // Python starts once the page has painted and the browser is idle (X.warmOnIdle), not at open:
  // the answers the build computed are on screen first; progress shows in the status line.
  function startPython() {
    if (window.location.protocol === "file:") {
      status("failed to start Python: this page was opened from a file; serve the book over http "
             + "(see the note above). The answers shown are for the default inputs.", "error");
      return;
    }
    status("answers below are for the default inputs, computed when the book was built; Python "
           + "starts in the background once the page has loaded, so that any input can be changed.", "waiting");
    window.addEventListener("labkit-python", (e) => {
      const st = e.detail;
      if (st.state === "starting") status(X.pythonText(st), "loading");
      else if (st.state === "ready") status(`ready: labkit.calc runs in your browser (Python started in ${(st.ms / 1000).toFixed(1)} s, `
                                            + `${((performance.now() - t0) / 1000).toFixed(1)} s after the page opened)`, "ready");
      else status("failed to start Python: " + st.text, "error");
    });
    X.warmOnIdle();
  }

  const canonical = (v) => JSON.stringify(Object.keys(v).sort().reduce((o, k) => ((o[k] = v[k]), o), {}));
  const error = (text) => h("div", { class: "calc-error", dataset: { key: "error" } }, "invalid input — " + text);
  const li = (...c) => h("li", null, ...c);

  // The bubble as idle/compute, (p-1)/(v m), and its share of the step, (p-1)/(v m + p-1) = b/(1+b):
  // p = 8, m = 1 is 700% of the compute but 87.5% of the step.
  const bubbleText = (b) => [num("bubble", b, (x) => percent(x, 2)), " of the compute time, ",
    num("bubble_share", b / (1 + b), (x) => percent(x)), " of the step"];
  const RENDER = {
    batch(a) {
      return [h("ul", null,
        li("data-parallel size ", num("data_parallel_size", a.data_parallel_size, integer)),
        li("microbatches per step (= gradient-accumulation steps) ", num("num_microbatches", a.num_microbatches, integer)),
        li("tokens per step ", num("tokens_per_step", a.tokens_per_step, integer)),
        li("pipeline bubble (p-1)/(v m) ", ...bubbleText(a.bubble))),
        ...a.warnings.map((w) => h("div", { class: "calc-warning" }, w))];
    },
    memory(a, box) {
      const fits = a.peak_bytes <= a.capacity_bytes;
      const shown = a.stages.length <= 8 ? a.stages : [...a.stages.slice(0, 4), ...a.stages.slice(-4)];
      const cols = [["params", "weights"], ["grads", "gradients"], ["optimizer", "optimizer"], ["activations", "activations"], ["total", "total"]];
      const m = a.megatron;
      const out = [
        h("p", null, "peak ", num("peak", a.peak_bytes, bytes), " per GPU: ", h("b", { class: fits ? "lx-fits" : "lx-nofit" }, fits ? "fits" : "does not fit"),
          ` in the ${a.gpu}'s `, num("capacity", a.capacity_bytes, bytes), `. ${a.attention}.`),
        ...X.memoryBars(a, Math.min(box.clientWidth || 600, 720)),
        h("div", { class: "pst-scrollable-table-container" }, h("table", { class: "table" },
          h("thead", null, h("tr", null, h("th", null, "stage"), cols.map(([, l]) => h("th", null, l)))),
          h("tbody", null, shown.map((r) => h("tr", null, h("td", null, String(r.stage)),
            cols.map(([k]) => h("td", null, num(`stage${r.stage}_${k}`, r[k], bytes)))))))),
        a.stages.length > 8 ? h("p", { class: "calc-note" }, `stages 4 to ${a.stages.length - 5} are in the bars above`) : "",
        h("p", null, "Megatron-LM's own estimate (first stage): weights and optimizer ", num("megatron_weight", m.weight_and_optimizer_bytes, bytes),
          ", activations ", num("megatron_activation", m.activation_bytes, bytes), " — its ",
          h("b", null, m.formula === "without SP" ? "without-SP formula, sbh(10 + 24/t) per layer + 5%" : "SP + selective formula, sbh(18 + 4·ffn/h)/t per layer"),
          ". Why it differs from labkit's stage 0 (", num("stage0_act", a.stages[0].activations, bytes), " of activations):"),
        h("ul", null, m.why.map((w) => li(w))),
        h("ul", null,
          li("model FLOPs per iteration ", num("flops", a.flops_per_iteration, flops)),
          a.mfu !== undefined ? li("MFU at that step time ", num("mfu", a.mfu, (x) => percent(x))) : "",
          a.step ? li(`predicted step on ${a.cluster} `, num("step_time", a.step.step_time, seconds), ": compute ", seconds(a.step.compute),
                      ", bubble ", seconds(a.step.bubble), ", TP comm ", seconds(a.step.tp_comm), ", PP comm ", seconds(a.step.pp_comm),
                      ", DP comm ", seconds(a.step.dp_comm), "; MFU ", num("predicted_mfu", a.step.mfu, (x) => percent(x)))
                 : li(a.no_step),
          li("bytes each GPU sends per step: DP ", num("dp_bytes", a.comm_bytes.dp, bytes), ", TP ", num("tp_bytes", a.comm_bytes.tp, bytes),
             ", PP (stage 0) ", num("pp_bytes", a.comm_bytes.pp, bytes), ", CP (ring) ", num("cp_bytes", a.comm_bytes.cp, bytes)),
          li("pipeline bubble ", ...bubbleText(a.bubble))),
        ...a.warnings.map((w) => h("div", { class: "calc-warning" }, w))];
      return out;
    },
    planner(a) {
      return [h("p", null, num("n_fit", a.n_fit, integer), " layouts fit, ", integer(a.too_big), " do not, ", integer(a.invalid),
                " break a rule; every layout's memory counted with one assumption: ", a.attention, "."),
        a.ranked.length ? h("div", { class: "pst-scrollable-table-container" }, h("table", { class: "table" },
          h("thead", null, h("tr", null, ["TP", "PP", "CP", "EP", "DP", "mb", "recompute", "memory", "tokens/s", "MFU", "step"].map((c) => h("th", null, c)))),
          h("tbody", null, a.ranked.map((r, i) => h("tr", null,
            ...["tp", "pp", "cp", "ep", "dp", "micro_batch_size", "recompute"].map((k) => h("td", null, String(r[k]))),
            h("td", null, bytes(r.peak_memory_gib * 2 ** 30)), h("td", null, num(`plan${i}_tokens_per_s`, r.tokens_per_s, integer)),
            h("td", null, percent(r.mfu)), h("td", null, seconds(r.step_time_s))))))) : "",
        h("ul", null, a.why.map((w) => li(w)))];
    },
  };

  function field(f, value) {
    const [name, label, kind, , choices] = f;
    let input;
    if (kind === "choice") {
      input = h("select", { name }, choices.map((c) => h("option", { value: c, selected: c === value }, c)));
    } else if (kind === "bool") {
      input = h("input", { type: "checkbox", name, checked: !!value });
    } else {
      input = h("input", { type: "number", name, value: String(value), step: kind === "float" ? "any" : "1",
                           inputmode: kind === "float" ? "decimal" : "numeric" });
    }
    input.dataset.kind = kind;
    return h("label", { class: "labkit-field" }, h("span", null, label), input);
  }

  // The form's values; a number field that is empty or not a number is returned as an error text.
  function read(form) {
    const out = {};
    for (const el of form.querySelectorAll("input, select")) {
      const kind = el.dataset.kind, label = el.closest("label").firstChild.textContent;
      if (kind === "bool") out[el.name] = el.checked;
      else if (kind === "choice") out[el.name] = el.value;
      else {
        const text = el.value.trim();
        // a number field holding "abc" reads as "" (the browser drops what it cannot parse): say so
        if (el.validity && el.validity.badInput) return { error: `"${label}" must be a number` };
        if (text === "") return { error: `"${label}" is empty: type a number` };
        const x = Number(text);
        if (!Number.isFinite(x)) return { error: `"${label}" must be a number, got "${text}"` };
        if (kind === "int" && !Number.isInteger(x)) return { error: `"${label}" must be a whole number, got ${text}` };
        out[el.name] = x;
      }
    }
    return { values: out };
  }

  function mount(id) {
    const box = document.getElementById(id);
    const data = JSON.parse(box.querySelector("script.lx-data").textContent);
    const cache = new Map(Object.entries(data.cache));
    const form = h("form", { class: "labkit-form", onsubmit: (e) => e.preventDefault() },
                   data.fields.map((f) => field(f, data.defaults[f[0]])));
    const answer = h("div", { class: "labkit-answer", "aria-live": "polite" });
    box.replaceChildren(form, answer);
    let asked = 0;

    function show(a, state) {
      answer.replaceChildren(...(a.error ? [error(a.error)] : RENDER[data.name](a, box)));
      box.dataset.state = state;
      box.dataset.updates = String(+(box.dataset.updates || 0) + 1);
      if (window.labkitScrollCue) window.labkitScrollCue.update();   // a wider table says it scrolls
    }
    async function update() {
      const mine = ++asked;
      const r = read(form);
      if (r.error) { box.dataset.inputs = ""; show({ error: r.error }, "ready"); return; }
      const k = canonical(r.values);
      box.dataset.inputs = k;
      if (cache.has(k)) { show(cache.get(k), "ready"); return; }
      box.dataset.state = "computing";
      answer.classList.add("lx-stale");
      let reply;
      try { reply = await X.ask(data.name, r.values); }
      catch (err) { answer.classList.remove("lx-stale"); show({ error: "Python could not start: " + err.message }, "failed"); return; }
      cache.set(k, reply.answer);
      if (mine !== asked) return;                 // a newer input is on its way
      answer.classList.remove("lx-stale");
      show(reply.answer, "ready");
    }
    const typed = X.debounce(update, TYPING_MS);
    form.addEventListener("input", (e) => (e.target.type === "number" ? typed() : update()));
    form.addEventListener("change", (e) => { if (e.target.type === "number") update(); });   // Enter / leaving the field: at once
    show(cache.get(canonical(data.defaults)), "ready");
    box.dataset.inputs = canonical(data.defaults);
    box.dataset.firstAnswerMs = performance.now().toFixed(1);   // read by tests/bench_book.py
  }

  window.labkitCalculators = { mount };
  startPython();
})();

/* The roofline explorer (directive {labkit-roofline}, book/_ext/labkit_moving.py): the ops of one
   layer on one GPU and the collectives of a layout, placed on the rooflines of HBM, NVLink and the
   network. Closed forms mirroring labkit/calc/roofline.py and labkit/calc/comm.py (the browser test
   checks them against labkit.calc on random layouts); window.labkitRoofline.compute is the same code. */
(function () {
  "use strict";
  const NS = "http://www.w3.org/2000/svg";
  const el = (tag, attrs, text) => {
    const e = document.createElementNS(NS, tag);
    for (const k in attrs) e.setAttribute(k, attrs[k]);
    if (text !== undefined) e.textContent = text;
    return e;
  };
  const gemm = (name, M, N, K, e, count = 1) => ({name, kind: "gemm", flops: count * 2 * M * N * K, bytes: count * e * (M * K + K * N + M * N), memory: "hbm"});

  // labkit.calc.roofline.layer_ops: the forward of one layer on one GPU
  function layerOps(m, tp, cp, b, ep, e) {
    const s = m.s, h = m.h, T = s / cp * b, q = m.d * m.a, kv = m.d * m.g, gate = m.swiglu ? 2 : 1;
    const ops = [gemm("qkv", T, (q + 2 * kv) / tp, h, e),
      {name: "attention", kind: "attention", flops: 2 * T * s * q / tp, bytes: e * (2 * T * q + 2 * s * b * kv) / tp, memory: "hbm"},
      gemm("proj", T, h, q / tp, e)];
    if (m.E) {
      const rows = ep * T * m.k / m.E, local = m.E / ep;
      ops.push(gemm("router", T, m.E, h, e), gemm("fc1", rows, m.moe_ffn * gate / tp, h, e, local), gemm("fc2", rows, h, m.moe_ffn / tp, e, local));
    } else {
      ops.push(gemm("fc1", T, m.ffn * gate / tp, h, e), gemm("fc2", T, h, m.ffn / tp, e));
    }
    ops.push({name: "norm", kind: "elementwise", flops: 4 * T * h, bytes: 2 * e * T * h, memory: "hbm"});
    return ops;
  }
  const train = (ops, names) => ops.filter((o) => names.includes(o.name)).reduce((a, o) => a + o.flops * (o.kind === "attention" ? 3.5 : 3), 0);
  const GEMMS = ["qkv", "proj", "fc1", "fc2", "router"];

  // labkit.calc.roofline.comm_ops with the bytes of labkit.calc.comm
  function commOps(m, L, e) {
    const {tp, cp, ep, b, mb} = L, s = m.s, h = m.h, ops = layerOps(m, tp, cp, b, ep, e), out = [];
    if (tp > 1) out.push({name: "TP all-reduce", axis: "tp", flops: train(ops, GEMMS), bytes: 4 * 2 * (tp - 1) / tp * (s / cp) * b * h * e});
    if (cp > 1) {
      const kvb = 2 * (s / cp) * b * (m.d * m.g / tp) * e;
      out.push({name: "CP ring K/V", axis: "cp", flops: train(ops, ["attention"]), bytes: 3 * (cp - 1) * kvb});
    }
    if (ep > 1 && m.E) out.push({name: "EP all-to-all", axis: "ep", flops: train(ops, ["fc1", "fc2"]), bytes: 4 * (ep - 1) / ep * (s / cp) * b * m.k * h * e});
    const q = m.d * m.a, kv = m.d * m.g, W = e * (h * (q + 2 * kv) + q * h + h * m.ffn * (m.swiglu ? 2 : 1) + m.ffn * h) / tp;
    const n = L.dp;
    if (n > 1) {
      const share = (n - 1) / n, f = mb * train(ops, GEMMS);
      if (L.fsdp) out.push({name: "FSDP gather/scatter", axis: "fsdp", flops: f, bytes: mb * share * W + 2 * mb * share * W});
      else out.push({name: "DP all-reduce", axis: "dp", flops: f, bytes: 2 * share * W});
    }
    out.forEach((o) => { o.kind = "collective"; o.memory = o.axis; });
    return out;
  }

  // labkit.calc.roofline.crossover
  function crossover(axis, n, peak, bw, e, swiglu, kvRatio) {
    const R = peak / bw, share = (n - 1) / n, gate = swiglu ? 2 : 1;
    return {dp: e / 3 * share * R, fsdp: e / 2 * share * R, tp: e / 9 * (n - 1) * R,
            cp: 6 * e / 7 * (n - 1) * kvRatio * R, ep: 2 * e / (3 * (gate + 1)) * share * R}[axis];
  }

  // labkit.calc.hardware.Cluster.link: bandwidth per rank of a group of `size` over `span` ranks
  function link(g, span, size) {
    if (g.gpus_per_node % span === 0) return [g.nvlink, "NVLink"];
    const stride = Math.max(1, Math.floor(span / size)), perNode = Math.max(1, Math.floor(g.gpus_per_node / stride));
    return [Math.min(g.nic * perNode / g.gpus_per_node, g.nvlink), "network"];
  }
  function spans(L) {
    return {tp: [L.tp, L.tp], cp: [L.tp * L.cp, L.cp], ep: [L.tp * L.ep, L.ep],
            dp: [L.tp * L.cp * L.dp, L.dp], fsdp: [L.tp * L.cp * L.dp, L.dp]};
  }

  function check(m, L) {
    const bad = [];
    for (const k of ["s", "b", "mb", "tp", "cp", "ep", "dp"]) if (!Number.isInteger(L[k]) || L[k] < 1) bad.push(`${k} must be a whole number of at least 1`);
    if (bad.length) return bad[0];
    if (m.a % L.tp || m.g % L.tp) return `TP = ${L.tp} must divide the ${m.a} heads and ${m.g} key/value groups`;
    if (L.s % (2 * L.cp) && L.cp > 1) return `the sequence ${L.s} must split into 2 x CP = ${2 * L.cp} chunks`;
    if (L.ep > 1 && !m.E) return "EP needs a model with experts (Mixtral, DeepSeek-MoE)";
    if (m.E && m.E % L.ep) return `EP = ${L.ep} must divide the ${m.E} experts`;
    if ((L.cp * L.dp) % L.ep) return `EP = ${L.ep} must divide CP x DP = ${L.cp * L.dp}`;
    return "";
  }

  // everything the page shows, for a model, a GPU and a layout: the browser test compares it with labkit
  function compute(data, v) {
    const m = {...data.models[v.model], s: v.s}, g = data.gpus[v.gpu], e = 2;
    const L = {tp: v.tp, cp: v.cp, ep: v.ep, dp: v.dp, fsdp: v.fsdp, b: v.b, mb: v.m, s: v.s};
    const error = check(m, L);
    if (error) return {error};
    const ops = layerOps(m, L.tp, L.cp, L.b, L.ep, e).map((o) => {
      const t = Math.max(o.flops / g.peak, o.bytes / g.hbm);
      return {...o, intensity: o.flops / o.bytes, bw: g.hbm, link: "HBM", time: t, bound: o.flops / o.bytes >= g.peak / g.hbm ? "compute" : "memory"};
    });
    const sp = spans(L);
    const comms = commOps(m, L, e).map((o) => {
      const [bw, name] = link(g, ...sp[o.axis]);
      return {...o, intensity: o.flops / o.bytes, bw, link: name, time: Math.max(o.flops / g.peak, o.bytes / bw),
              ratio: (o.bytes / bw) / (o.flops / g.peak), bound: o.flops / o.bytes >= g.peak / bw ? "compute" : "link"};
    });
    const kvRatio = m.g / m.a, ffn = m.E ? m.moe_ffn : m.ffn;
    const now = {dp: L.mb * L.s / L.cp * L.b, fsdp: L.mb * L.s / L.cp * L.b, tp: m.h, cp: L.s, ep: ffn};
    const sizes = {dp: L.dp, fsdp: L.dp, tp: L.tp, cp: L.cp, ep: L.ep};
    const cross = ["tp", "cp", "ep", L.fsdp ? "fsdp" : "dp"].filter((a) => sizes[a] > 1).map((a) => {
      const [bw, name] = link(g, ...sp[a]);
      return {axis: a, n: sizes[a], link: name, bw, crossover: crossover(a, sizes[a], g.peak, bw, e, m.swiglu, kvRatio), now: now[a]};
    });
    return {ops, comms, cross, peak: g.peak, hbm: g.hbm, nvlink: g.nvlink, nic: g.nic / g.gpus_per_node};
  }

  const fmt = (x) => x >= 1e4 || x < 0.01 ? x.toExponential(2) : x >= 100 ? x.toFixed(0) : x.toPrecision(3);
  const ms = (t) => (t * 1e3).toPrecision(3);
  const UNITS = {dp: "tokens per GPU per step", fsdp: "tokens per GPU per step", tp: "hidden size h", cp: "sequence length s", ep: "expert FFN size"};
  const COLORS = {HBM: "#1f77b4", NVLink: "#2ca02c", network: "#d62728"};

  function draw(svg, r) {
    const W = 360, H = 250, x0 = 46, y0 = 12, pw = W - x0 - 10, ph = H - 44;
    const lx = [0, 5], ly = [Math.log10(r.peak) - 3.5, Math.log10(r.peak) + 0.3];
    const X = (i) => x0 + (Math.min(Math.log10(Math.max(i, 1)), lx[1]) - lx[0]) / (lx[1] - lx[0]) * pw;   // clamped to the plot
    const Y = (f) => y0 + ph - (Math.log10(Math.max(f, 10 ** ly[0])) - ly[0]) / (ly[1] - ly[0]) * ph;
    if (!svg.firstChild) {
      svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
      svg.appendChild(el("g", {class: "rl-axes"}));
      svg.appendChild(el("g", {class: "rl-roofs"}));
      svg.appendChild(el("g", {class: "rl-ops"}));
    }
    const [axes, roofs, opsG] = svg.children;
    axes.replaceChildren();
    for (let k = lx[0]; k <= lx[1]; k++) {
      axes.appendChild(el("line", {x1: X(10 ** k), x2: X(10 ** k), y1: y0, y2: y0 + ph, class: "lx-grid"}));
      axes.appendChild(el("text", {x: X(10 ** k), y: y0 + ph + 14, "text-anchor": "middle", class: "lx-tick"}, `10${["⁰", "¹", "²", "³", "⁴", "⁵"][k]}`));
    }
    for (let k = Math.ceil(ly[0]); k <= ly[1]; k++) {
      axes.appendChild(el("line", {x1: x0, x2: x0 + pw, y1: Y(10 ** k), y2: Y(10 ** k), class: "lx-grid"}));
      axes.appendChild(el("text", {x: x0 - 4, y: Y(10 ** k) + 4, "text-anchor": "end", class: "lx-tick"}, fmt(10 ** k / 1e12)));
    }
    axes.appendChild(el("text", {x: x0 + pw / 2, y: H - 4, "text-anchor": "middle", class: "lx-tick"}, "FLOPs per byte (HBM, or the link for ◆)"));
    axes.appendChild(el("text", {x: 11, y: y0 + ph / 2, "text-anchor": "middle", class: "lx-tick", transform: `rotate(-90 11 ${y0 + ph / 2})`}, "TFLOP/s"));
    roofs.replaceChildren();
    [["HBM", r.hbm], ["NVLink", r.nvlink], ["network", r.nic]].forEach(([name, bw], i) => {
      const ridge = r.peak / bw, a = 10 ** lx[0];
      roofs.appendChild(el("polyline", {points: `${X(a)},${Y(a * bw)} ${X(ridge)},${Y(r.peak)} ${X(10 ** lx[1])},${Y(r.peak)}`, class: "rl-roof", stroke: COLORS[name]}));
      roofs.appendChild(el("text", {x: x0 + pw, y: y0 + ph - 6 - 13 * (2 - i), "text-anchor": "end", class: "lx-tick", fill: COLORS[name]}, `${name} ridge ${fmt(ridge)}`));
    });
    const all = [...r.ops, ...r.comms], seen = new Set();
    for (const g of [...opsG.children]) if (!all.some((o) => o.name === g.dataset.op)) g.remove();
    all.forEach((o, i) => {
      let g = [...opsG.children].find((c) => c.dataset.op === o.name);
      if (!g) {
        g = el("g", {class: "rl-op"});
        g.dataset.op = o.name;
        g.appendChild(o.kind === "collective" ? el("path", {d: "M0,-6 L6,0 L0,6 L-6,0 Z"}) : el("circle", {r: 5}));
        g.appendChild(el("text", {x: 7, y: -5 + (i % 2) * 13, class: "lx-tick"}, o.name));
        opsG.appendChild(g);
      }
      const right = X(o.intensity) > x0 + pw * 0.55, label = g.lastChild;   // labels stay inside the plot
      label.setAttribute("x", right ? -7 : 7);
      label.setAttribute("text-anchor", right ? "end" : "start");
      const col = COLORS[o.link];
      g.firstChild.setAttribute("fill", col);
      const y = Y(Math.min(r.peak, o.intensity * o.bw));
      g.setAttribute("transform", `translate(${X(o.intensity).toFixed(1)},${y.toFixed(1)})`);
      seen.add(o.name);
    });
  }

  function table(r) {
    const rows = [...r.ops, ...r.comms].map((o) => `<tr data-op="${o.name}" data-intensity="${o.intensity}" data-time="${o.time}" data-bound="${o.bound}">` +
      `<td>${o.name}</td><td>${fmt(o.flops / 1e9)}</td><td>${fmt(o.bytes / 1e6)}</td><td>${fmt(o.intensity)}</td><td>${o.link}</td>` +
      `<td class="${o.bound === "compute" ? "rl-ok" : "rl-comm"}">${o.bound}</td><td>${ms(o.time)}</td></tr>`).join("");
    return `<div class="lx-scroll"><table class="rl-ops"><thead><tr><th>op</th><th>GFLOP</th><th>MB</th><th>FLOPs/byte</th><th>through</th><th>bound by</th><th>ms</th></tr></thead><tbody>${rows}</tbody></table></div>`;
  }
  function crossTable(r) {
    if (!r.cross.length) return "<p>One GPU: no collective. Raise TP, CP, EP or DP.</p>";
    const rows = r.cross.map((c) => {
      const op = r.comms.find((o) => o.axis === c.axis), bad = op && op.ratio > 1;
      return `<tr data-axis="${c.axis}" data-crossover="${c.crossover}" data-ratio="${op ? op.ratio : ""}"><td>${c.axis.toUpperCase()} ${c.n} (${c.link})</td>` +
        `<td>${UNITS[c.axis]}</td><td>${fmt(c.crossover)}</td><td>${fmt(c.now)}</td>` +
        `<td class="${bad ? "rl-comm" : "rl-ok"}">${op ? op.ratio.toFixed(2) : "-"}${bad ? " comm-bound" : ""}</td></tr>`;
    }).join("");
    return `<div class="lx-scroll"><table class="rl-cross"><thead><tr><th>axis</th><th>crossover in</th><th>crossover</th><th>this layout</th><th>comm / compute</th></tr></thead><tbody>${rows}</tbody></table></div>`;
  }

  function mount(id) {
    const fig = document.getElementById(id);
    if (!fig || fig.dataset.mounted) return;
    fig.dataset.mounted = "1";
    const data = JSON.parse(fig.querySelector(".lx-data").textContent);
    fig.querySelector(".lx-noscript").remove();
    const v = {...data.defaults};
    const controls = document.createElement("div");
    controls.className = "lx-controls";
    const add = (name, label, input) => {
      const d = document.createElement("div");
      d.className = "lx-control" + (input.type === "checkbox" ? " lx-check" : "");
      const l = document.createElement("label");
      l.textContent = label; l.htmlFor = `${id}-${name}`; input.id = `${id}-${name}`; input.name = name;
      if (input.type === "checkbox") d.append(input, l); else d.append(l, input);
      controls.appendChild(d);
      input.addEventListener(input.tagName === "SELECT" || input.type === "checkbox" ? "change" : "input", () => {
        v[name] = input.type === "checkbox" ? input.checked : input.tagName === "SELECT" ? input.value : Number(input.value);
        update();
      });
    };
    const select = (name, label, options) => {
      const s = document.createElement("select");
      for (const [k, o] of Object.entries(options)) s.appendChild(new Option(o.label || k, k));
      s.value = v[name]; add(name, label, s);
    };
    select("gpu", "GPU (node)", data.gpus);
    select("model", "model", data.models);
    for (const [name, label] of [["s", "sequence length s"], ["b", "micro batch b"], ["m", "microbatches per step"],
      ["tp", "TP"], ["cp", "CP"], ["ep", "EP"], ["dp", "DP (or FSDP) size"]]) {
      const i = document.createElement("input");
      i.type = "number"; i.min = 1; i.step = 1; i.value = v[name]; add(name, label, i);
    }
    const c = document.createElement("input");
    c.type = "checkbox"; c.checked = v.fsdp; add("fsdp", "DP axis is FSDP (ZeRO-3)", c);
    const svg = el("svg", {class: "rl-svg", role: "img"});
    const status = document.createElement("p");
    status.className = "lx-status"; status.setAttribute("aria-live", "polite");
    const out = document.createElement("div");
    out.className = "rl-out";
    fig.insertBefore(controls, fig.querySelector("figcaption"));
    fig.insertBefore(svg, fig.querySelector("figcaption"));
    fig.insertBefore(status, fig.querySelector("figcaption"));
    fig.insertBefore(out, fig.querySelector("figcaption"));
    function update() {
      const r = compute(data, v);
      if (r.error) {
        status.innerHTML = `<span class="lx-error">${r.error}</span>`;
        svg.classList.add("lx-stale"); out.classList.add("lx-stale");
        fig.dataset.error = r.error;
        return;
      }
      fig.dataset.error = "";
      svg.classList.remove("lx-stale"); out.classList.remove("lx-stale");
      draw(svg, r);
      const worst = r.comms.filter((o) => o.ratio > 1).map((o) => o.name);
      const words = `${r.ops.filter((o) => o.bound === "compute").length} of ${r.ops.length} ops of the layer are compute-bound on HBM; ` +
        (worst.length ? `${worst.join(", ")} take${worst.length > 1 ? "" : "s"} longer than the compute ${worst.length > 1 ? "they hide" : "it hides"} behind.` :
          r.comms.length ? "every collective fits under its compute (if overlapped)." : "no collective.");
      status.textContent = words;
      svg.setAttribute("aria-label", `Roofline of ${data.gpus[v.gpu].label}: ${words}`);
      out.innerHTML = crossTable(r) + table(r);
    }
    update();
    fig.dataset.firstAnswerMs = performance.now().toFixed(1);   // read by tests/bench_book.py
  }
  window.labkitRoofline = {mount, compute};
})();

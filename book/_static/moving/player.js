/* The book's moving pictures (directive {labkit-player}, book/_ext/labkit_moving.py): steps through
   frames labkit.figures.frames computed at build time. Plays only when asked, or when scrolled into
   view if the reader's system allows motion (prefers-reduced-motion: no autoplay, no transitions;
   the buttons still step). The figure's data-frame attribute is the frame shown (the browser test reads it). */
(function () {
  "use strict";
  const NS = "http://www.w3.org/2000/svg";
  const COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"];
  const reduced = () => window.matchMedia && window.matchMedia("(prefers-reduced-motion: reduce)").matches;
  const el = (tag, attrs, text) => {
    const e = document.createElementNS(NS, tag);
    for (const k in attrs) e.setAttribute(k, attrs[k]);
    if (text !== undefined) e.textContent = text;
    return e;
  };
  const fmt = (x) => (Math.round(x * 1000) / 1000).toString();

  function drawRing(svg, data, f) {
    const n = data.n, cw = 300 / n, ch = 30, x0 = 52, frame = data.frames[f];
    svg.setAttribute("viewBox", `0 0 360 ${n * (ch + 6) + 34}`);
    svg.replaceChildren();
    for (let c = 0; c < n; c++) svg.appendChild(el("text", {x: x0 + c * cw + cw / 2, y: 14, "text-anchor": "middle", class: "lx-tick"}, `chunk ${c}`));
    const sending = new Set(frame.sending.map(([r, c]) => `${r},${c}`));
    for (let r = 0; r < n; r++) {
      const y = 22 + r * (ch + 6);
      svg.appendChild(el("text", {x: 4, y: y + ch / 2 + 4, class: "lx-tick"}, `rank ${r}`));
      for (let c = 0; c < n; c++) {
        const who = frame.cells[r][c], full = who.length === n;
        const g = el("g", {class: "mv-cell" + (sending.has(`${r},${c}`) ? " mv-send" : "")});
        g.appendChild(el("rect", {x: x0 + c * cw + 2, y, width: cw - 4, height: ch, rx: 3,
          fill: who.length ? (full ? "#1b5e20" : COLORS[who[0] % 8]) : "#fff",
          "fill-opacity": who.length ? (full ? 1 : 0.35 + 0.5 * who.length / n) : 1, stroke: "#888"}));
        g.appendChild(el("text", {x: x0 + c * cw + cw / 2, y: y + ch / 2 + 4, "text-anchor": "middle",
          class: "lx-box" + (full ? " lx-light" : "")}, who.length ? (full ? "sum" : who.join("+")) : ""));
        svg.appendChild(g);
      }
    }
    return `${frame.text}. Sent by each rank so far: ${fmt(frame.sent)} N.`;
  }

  function drawZero(svg, data, stage, f) {
    const n = data.n, frame = data.stages[stage].frames[f], names = [["weights", "#4c72b0"], ["grads", "#dd8452"], ["optim", "#55a868"]];
    const rowH = 3 * 12 + 10, segW = 240 / n, x0 = 56;
    svg.setAttribute("viewBox", `0 0 360 ${n * rowH + 22}`);
    svg.replaceChildren();
    names.forEach(([name, color], i) => {
      svg.appendChild(el("rect", {x: x0 + i * 95, y: 2, width: 11, height: 11, fill: color}));
      svg.appendChild(el("text", {x: x0 + i * 95 + 15, y: 12, class: "lx-tick"}, name === "optim" ? "optimizer" : name));
    });
    frame.ranks.forEach((held, r) => {
      const y = 20 + r * rowH;
      svg.appendChild(el("text", {x: 4, y: y + 22, class: "lx-tick"}, `rank ${r}`));
      names.forEach(([name, color], i) => {
        for (let c = 0; c < n; c++) {
          const has = held[name].includes(c);
          svg.appendChild(el("rect", {x: x0 + c * segW + 1, y: y + i * 12, width: segW - 2, height: 10,
            fill: has ? color : "none", stroke: has ? color : "#bbb", class: "mv-seg"}));
        }
      });
    });
    const op = frame.collective ? ` [${frame.collective.replace("_", "-")}]` : "";
    return `${frame.text}${op}. Sent by each rank so far: ${fmt(frame.sent)} P.`;
  }

  function mount(id) {
    const fig = document.getElementById(id);
    if (!fig || fig.dataset.mounted) return;
    fig.dataset.mounted = "1";
    const data = JSON.parse(fig.querySelector(".lx-data").textContent);
    fig.querySelector(".lx-noscript").remove();
    const box = document.createElement("div");
    box.className = "mv-box";
    const controls = document.createElement("div");
    controls.className = "lx-player";
    const mk = (label, cls, aria) => {
      const b = document.createElement("button");
      b.type = "button"; b.className = "lx-btn " + cls; b.textContent = label; b.setAttribute("aria-label", aria);
      controls.appendChild(b); return b;
    };
    const back = mk("◀ step", "mv-back", "previous step"), play = mk("▶ play", "mv-play", "play"),
      fwd = mk("step ▶", "mv-step", "next step");
    const counter = document.createElement("span");
    counter.className = "mv-counter";
    controls.appendChild(counter);
    let stage = 0;
    if (data.kind === "zero" && data.stages.length > 1) {
      const sel = document.createElement("select");
      sel.className = "mv-stage"; sel.setAttribute("aria-label", "ZeRO stage");
      data.stages.forEach((s, i) => sel.appendChild(new Option(`ZeRO-${s.stage}` + (s.stage ? "" : " (plain DP)"), i)));
      sel.addEventListener("change", () => { stage = +sel.value; show(0); });
      controls.appendChild(sel);
    }
    const svg = el("svg", {class: "mv-svg", role: "img"});
    const text = document.createElement("p");
    text.className = "mv-text"; text.setAttribute("aria-live", "polite");
    box.append(controls, svg, text);
    fig.insertBefore(box, fig.querySelector("figcaption"));
    const count = () => data.kind === "ring" ? data.frames.length : data.stages[stage].frames.length;
    let frame = 0, timer = null;
    function show(f) {
      frame = Math.max(0, Math.min(count() - 1, f));
      const words = data.kind === "ring" ? drawRing(svg, data, frame) : drawZero(svg, data, stage, frame);
      text.textContent = words;
      svg.setAttribute("aria-label", words);
      counter.textContent = `step ${frame} / ${count() - 1}`;
      fig.dataset.frame = String(frame);
      if (!fig.dataset.firstAnswerMs) fig.dataset.firstAnswerMs = performance.now().toFixed(1);   // tests/bench_book.py
      fig.classList.toggle("mv-still", reduced());
    }
    function stop() { if (timer) clearInterval(timer); timer = null; play.textContent = "▶ play"; play.setAttribute("aria-label", "play"); fig.dataset.playing = ""; }
    function start() {
      if (timer) return;
      if (frame >= count() - 1) show(0);
      play.textContent = "⏸ pause"; play.setAttribute("aria-label", "pause"); fig.dataset.playing = "1";
      timer = setInterval(() => { if (frame >= count() - 1) stop(); else show(frame + 1); }, reduced() ? 1500 : 1100);
    }
    play.addEventListener("click", () => (timer ? stop() : start()));
    fwd.addEventListener("click", () => { stop(); show(frame + 1); });
    back.addEventListener("click", () => { stop(); show(frame - 1); });
    show(0);
    if (!reduced() && "IntersectionObserver" in window) {   // autoplay once, when seen, if motion is welcome
      const io = new IntersectionObserver((entries) => {
        if (entries.some((e) => e.isIntersecting)) { io.disconnect(); if (!reduced()) start(); }
      }, {threshold: 0.6});
      io.observe(svg);
    }
  }
  window.labkitPlayer = {mount};
})();

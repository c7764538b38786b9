// Pipeline-schedule stepper: choose p, m, v and the schedule; play or step through time; see the
// bubble, the microbatches each rank holds (its activation memory) and the messages on each link.
// Every timeline comes from labkit.pipeline_parallel.schedules + simulate, run when the book was
// built (book/_ext/labkit_explorers.py: pipeline.json holds the whole grid; the page's own case is
// inline). Time unit: one forward of a whole pipeline stage (a chunk of an interleaved rank is 1/v).
(function () {
  "use strict";
  const X = window.labkitExplorers;
  const { h, s, num, percent } = X;
  const NAMES = { gpipe: "GPipe", "1f1b": "1F1B", interleaved: "interleaved 1F1B", "zb-h1": "ZB-H1" };
  const KIND = { F: "forward", B: "backward", W: "weight gradient" };
  const SHADES = { F: ["#1f5fa8", "#5b9bd5", "#9dc3e6", "#c9ddf0"], B: ["#2e7d32", "#66bb6a", "#a5d6a7", "#d0ecd1"],
                   W: ["#616161", "#9e9e9e", "#bdbdbd", "#e0e0e0"] };
  let grid = null, gridLoading = null;

  function loadGrid() {
    if (!gridLoading) {
      gridLoading = fetch(X.base + "pipeline.json").then((r) => r.json()).then((g) => { grid = g; return g; });
    }
    return gridLoading;
  }

  // One case -> events {rank, kind, mb, chunk, start, end} in simulator time units.
  function decode(c) {
    const events = [];
    c.ranks.forEach((text, rank) => {
      let t = 0;
      for (const tok of text.split(" ")) {
        if (!tok) continue;
        if (tok[0] === "+") { t += +tok.slice(1); continue; }
        const [mb, chunk] = tok.slice(1).split(".");
        const e = { rank, kind: tok[0], mb: +mb, chunk: chunk ? +chunk : 0, start: t, end: t + c.costs[tok[0]] };
        events.push(e);
        t = e.end;
      }
    });
    return events;
  }

  // Messages: the F of virtual stage s sends its output to stage s+1; the B of stage s sends the
  // gradient of its input to stage s-1 (schedules.dependencies). Rank r holds stages r, r+p, ...
  function messages(events, p, v) {
    const S = p * v, at = new Map();
    for (const e of events) at.set(`${e.kind}${e.mb}.${e.chunk}@${e.rank}`, e);
    const out = [];
    for (const e of events) {
      const stage = e.chunk * p + e.rank;
      let to = null, what = null;
      if (e.kind === "F" && stage < S - 1) { to = stage + 1; what = "activation"; }
      if (e.kind === "B" && stage > 0) { to = stage - 1; what = "gradient"; }
      if (to === null) continue;
      const rank = to % p, chunk = Math.floor(to / p);
      const recv = at.get(`${e.kind}${e.mb}.${chunk}@${rank}`);
      out.push({ from: e.rank, to: rank, what, mb: e.mb, sent: e.end, used: recv ? recv.start : e.end });
    }
    return out;
  }

  // Microbatch-chunks whose activations each rank holds at time t: F begun, backward not finished
  // (B, or W when the schedule splits the backward), as simulate.peak_in_flight counts them.
  function held(events, p, t) {
    const last = events.some((e) => e.kind === "W") ? "W" : "B";
    const n = new Array(p).fill(0);
    for (const e of events) {
      if (e.kind === "F" && e.start < t) n[e.rank] += 1;
      if (e.kind === last && e.end <= t) n[e.rank] -= 1;
    }
    return n;
  }

  function formula(name, p, m, v) {
    if (name === "zb-h1") return { text: "(p-1)/(3m) when F = B = W", value: (p - 1) / (3 * m) };
    return { text: v > 1 ? "(p-1)/(v m)" : "(p-1)/m", value: (p - 1) / (v * m) };
  }

  X.kinds.pipeline = function (fig, body, config, data) {
    // t starts at the end: the whole schedule is on screen; play runs it again from 0
    const state = { name: config.schedule, p: config.p, m: config.m, v: config.v, t: data.case.makespan, playing: null };
    const cases = new Map([[data.key, data.case]]);
    const key = () => `${state.name}/${state.p}/${state.m}/${state.name === "interleaved" ? state.v : 1}`;
    const status = h("p", { class: "lx-status", role: "status", "aria-live": "polite" });

    const ctl = {
      schedule: X.choiceSelect("schedule", "schedule", ["gpipe", "1f1b", "interleaved", "zb-h1"], state.name,
                               (x) => change({ name: x, v: x === "interleaved" ? Math.max(2, state.v) : 1 }),
                               (x) => NAMES[x]),
      p: X.choiceSlider("p", "pipeline ranks p", [2, 3, 4, 5, 6, 7, 8], state.p, (x) => change({ p: x })),
      m: X.choiceSlider("m", "microbatches m", Array.from({ length: 16 }, (_, i) => i + 1), state.m, (x) => change({ m: x })),
      v: X.choiceSlider("v", "chunks per rank v", [1, 2, 3, 4], state.v, (x) => change({ v: x, name: x > 1 ? "interleaved" : (state.name === "interleaved" ? "1f1b" : state.name) })),
    };
    const playBtn = h("button", { type: "button", class: "lx-btn", "aria-label": "play" }, "▶ play");
    const back = h("button", { type: "button", class: "lx-btn", "aria-label": "step back" }, "◀ step");
    const fwd = h("button", { type: "button", class: "lx-btn", "aria-label": "step forward" }, "step ▶");
    const timeIn = h("input", { type: "range", min: 0, max: 1, step: 1, value: 0, name: "t", "aria-label": "time" });
    const timeOut = h("output", { class: "lx-value" });
    const svgBox = h("div", { class: "lx-scroll", tabindex: "0", role: "group",
                              "aria-label": "timeline: space plays or pauses, arrow keys step (scrolls sideways on small screens)" });
    const stats = h("div", { class: "lx-stats" });
    const ranks = h("div", { class: "lx-ranks" });
    const links = h("div", { class: "lx-links" });
    body.append(h("div", { class: "lx-controls" }, ctl.schedule, ctl.p, ctl.m, ctl.v),
                h("div", { class: "lx-player" }, back, playBtn, fwd,
                  h("label", { class: "lx-time" }, "time ", timeIn, timeOut)),
                status, svgBox, stats, h("div", { class: "lx-two" }, ranks, links));

    function stop() {
      if (state.playing) { clearInterval(state.playing); state.playing = null; }
      playBtn.textContent = "▶ play"; playBtn.setAttribute("aria-label", "play");
    }
    playBtn.addEventListener("click", () => {
      const c = cases.get(key());
      if (!c || c.error) return;
      if (state.playing) { stop(); return; }
      if (state.t >= c.makespan) state.t = 0;
      playBtn.textContent = "❚❚ pause"; playBtn.setAttribute("aria-label", "pause");
      state.playing = setInterval(() => {
        state.t += 1;
        if (state.t >= c.makespan) { state.t = c.makespan; stop(); }
        draw();
      }, X.reduceMotion() ? 700 : 260);
    });
    back.addEventListener("click", () => { stop(); state.t = Math.max(0, state.t - 1); draw(); });
    fwd.addEventListener("click", () => { stop(); const c = cases.get(key()); if (c && !c.error) state.t = Math.min(c.makespan, state.t + 1); draw(); });
    timeIn.addEventListener("input", () => { stop(); state.t = +timeIn.value; draw(); });
    fig.addEventListener("keydown", (e) => {
      if (["INPUT", "SELECT", "BUTTON"].includes(e.target.tagName)) return;   // their own keys
      if (e.key === " " || e.key === "k") { e.preventDefault(); playBtn.click(); }
      else if (e.key === "ArrowRight" || e.key === "l") { e.preventDefault(); fwd.click(); }
      else if (e.key === "ArrowLeft" || e.key === "j") { e.preventDefault(); back.click(); }
    });

    function change(patch) {
      stop();
      Object.assign(state, patch);
      if (state.name !== "interleaved") state.v = 1;
      ctl.schedule.set(state.name); ctl.v.set(state.v); ctl.p.set(state.p); ctl.m.set(state.m);
      ctl.v.input.disabled = false;
      const k = key();
      if (!cases.has(k)) {
        if (grid) cases.set(k, grid.cases[k]);
        else {
          status.textContent = "loading the schedules ...";
          loadGrid().then(() => change({}), () => {
            gridLoading = null;   // try again on the next change
            status.textContent = window.location.protocol === "file:"
              ? "The other schedules are in a data file that a page opened from a file cannot read: " + X.FILE_HINT.split(": ")[1] + "."
              : "could not load the schedules (pipeline.json); try again";
          });
          return;
        }
      }
      const c = cases.get(k);
      state.t = c && !c.error ? c.makespan : 0;    // a new schedule is shown whole
      X.captionNote(fig, k !== data.key);
      draw();
    }

    const scaleOf = () => (state.name === "interleaved" ? state.v : 1);
    const fmtT = (t) => { const x = t / scaleOf(); return Number.isInteger(x) ? String(x) : x.toFixed(2); };

    function draw() {
      const c = cases.get(key());
      fig.dataset.case = key();
      if (!c) return;
      if (c.error) {
        status.textContent = "";
        status.append(h("span", { class: "lx-error", dataset: { key: "error" } }, "rule: " + c.error));
        svgBox.replaceChildren(); stats.replaceChildren(); ranks.replaceChildren(); links.replaceChildren();
        return;
      }
      status.textContent = `${NAMES[state.name]}, p = ${state.p}, m = ${state.m}` + (state.v > 1 ? `, v = ${state.v}` : "")
        + ` — t = ${fmtT(state.t)} of ${fmtT(c.makespan)}`;
      const events = decode(c), p = state.p, v = c.v;
      timeIn.max = c.makespan; timeIn.value = state.t; timeOut.textContent = `${fmtT(state.t)} / ${fmtT(c.makespan)}`;
      timeIn.setAttribute("aria-valuetext", `time ${fmtT(state.t)} of ${fmtT(c.makespan)}`);
      fig.dataset.t = String(state.t);
      drawTimeline(events, c, p, v);
      // stats: the bubble as simulated and as the formula gives it
      const f = formula(state.name, p, state.m, v);
      stats.replaceChildren(
        // idle/compute can exceed 100% (p = 8, m = 1: 700%); its share of the step, b/(1+b), cannot
        h("span", null, "bubble (simulated idle / compute) ", num("bubble", c.bubble, (x) => percent(x)),
          ", ", num("bubble_share", c.bubble / (1 + c.bubble), (x) => percent(x)), " of the step"),
        h("span", null, `formula ${f.text} = `, num("bubble_formula", f.value, (x) => percent(x))),
        h("span", null, "iteration ", num("makespan", c.makespan, (x) => fmtT(x)), " forward-times of a stage"));
      // microbatches in flight = activation memory per rank
      const now = held(events, p, state.t), peakAll = Math.max(...c.peak_in_flight);
      ranks.replaceChildren(h("div", { class: "lx-subhead" }, "activations held per rank (microbatch" + (v > 1 ? "-chunks" : "es") + ")"),
        ...now.map((n, r) => h("div", { class: "lx-rank" },
          h("span", { class: "lx-rlabel" }, `rank ${r}`),
          h("span", { class: "lx-meter", role: "img", "aria-label": `rank ${r} holds ${n}, at most ${c.peak_in_flight[r]}` },
            h("span", { class: "lx-meter-peak", style: `width:${100 * c.peak_in_flight[r] / peakAll}%` }),
            h("span", { class: "lx-meter-now", style: `width:${100 * n / peakAll}%` })),
          h("span", null, num(`inflight${r}`, n, String), " now, peak ", num(`peak${r}`, c.peak_in_flight[r], String),
            v > 1 ? ` (${(c.peak_in_flight[r] / v).toFixed(2)} stage-microbatches)` : ""))));
      // messages on each link: sent so far, and the ones sent at this instant
      const msgs = messages(events, p, v);
      const pairs = [];
      for (let r = 0; r + 1 < p; r++) pairs.push([r, r + 1]);
      if (v > 1) pairs.push([p - 1, 0]);
      links.replaceChildren(h("div", { class: "lx-subhead" }, "messages per link (so far; ", h("b", null, "bold"), " = sent now)"),
        ...pairs.map(([a, b]) => {
          const fwdM = msgs.filter((x) => x.from === a && x.to === b && x.sent <= state.t);
          const bwdM = msgs.filter((x) => x.from === b && x.to === a && x.sent <= state.t);
          const nowF = fwdM.filter((x) => x.sent === state.t), nowB = bwdM.filter((x) => x.sent === state.t);
          return h("div", { class: "lx-link" }, `${a} → ${b}: `, num(`act${a}-${b}`, fwdM.length, String), " act.",
            nowF.length ? h("b", null, ` (mb ${nowF.map((x) => x.mb).join(", ")})`) : "",
            `; ${b} → ${a}: `, num(`grad${b}-${a}`, bwdM.length, String), " grad.",
            nowB.length ? h("b", null, ` (mb ${nowB.map((x) => x.mb).join(", ")})`) : "");
        }));
      drawArrows(msgs.filter((x) => x.sent === state.t), p);
    }

    let geom = null;
    function drawTimeline(events, c, p, v) {
      const width = Math.max(svgBox.clientWidth || 600, 320);
      const left = 52, top = 20, row = 24;
      const unit = Math.max(8, (width - left - 8) / c.makespan);
      const W = left + unit * c.makespan + 8, H = top + row * p + 6;
      geom = { left, top, row, unit };
      const svg = s("svg", { viewBox: `0 0 ${W} ${H}`, width: W, height: H, class: "lx-timeline", role: "img",
                             "aria-label": `${NAMES[state.name]} timeline: ${p} ranks, ${state.m} microbatches, ends at ${fmtT(c.makespan)}`,
                             "data-span": c.makespan });
      const ticks = Math.min(12, c.makespan), step = Math.max(1, Math.ceil(c.makespan / ticks));
      for (let t = 0; t <= c.makespan; t += step) {
        svg.append(s("line", { x1: left + t * unit, x2: left + t * unit, y1: top - 4, y2: H - 4, class: "lx-grid" }),
                   s("text", { x: left + t * unit, y: 12, "text-anchor": "middle", class: "lx-tick" }, fmtT(t)));
      }
      for (let r = 0; r < p; r++) svg.append(s("text", { x: 4, y: top + r * row + row / 2 + 4, class: "lx-tick" }, `rank ${r}`));
      let drawnEnd = 0;
      for (const e of events) {
        const colour = SHADES[e.kind][Math.min(e.chunk, 3)];
        const x = left + e.start * unit, w = (e.end - e.start) * unit, y = top + e.rank * row + 2;
        const future = e.start >= state.t;
        const g = s("g", { class: future ? "lx-future" : (e.end > state.t ? "lx-now" : "lx-done") },
          s("rect", { x, y, width: w, height: row - 4, fill: colour, "data-end": e.end, "data-start": e.start,
                      "data-rank": e.rank, "data-action": `${e.kind}${e.mb}` + (e.chunk ? `.${e.chunk}` : "") },
            s("title", null, `${KIND[e.kind]} of microbatch ${e.mb}` + (v > 1 ? `, chunk ${e.chunk}` : "") + ` on rank ${e.rank}: ${fmtT(e.start)}–${fmtT(e.end)}`)));
        if (w >= 11) g.append(s("text", { x: x + w / 2, y: y + (row - 4) / 2 + 4, "text-anchor": "middle",
                                          class: e.chunk === 0 || e.kind !== "F" ? "lx-box lx-light" : "lx-box" }, String(e.mb)));
        svg.append(g);
        drawnEnd = Math.max(drawnEnd, e.end);
      }
      svg.dataset.drawnEnd = String(drawnEnd);
      svg.append(s("line", { x1: left + state.t * unit, x2: left + state.t * unit, y1: top - 6, y2: H, class: "lx-cursor" }));
      svg.append(s("g", { class: "lx-arrows" }));
      const keepScroll = svgBox.scrollLeft;
      const kinds = c.costs.W ? ["F", "B", "W"] : ["F", "B"];
      const legend = h("p", { class: "lx-legend" }, kinds.map((k) =>
        h("span", null, h("span", { class: "lx-swatch", style: `background:${SHADES[k][0]}` }),
          k === "B" && c.costs.W ? "backward (input gradient) " : KIND[k] + " ")),
        v > 1 ? "; lighter shades: later model chunks" : "", "; the number is the microbatch; red line: now");
      svgBox.replaceChildren(svg);
      svgBox.after(legend);
      if (svgBox.legend) svgBox.legend.remove();
      svgBox.legend = legend;
      svgBox.scrollLeft = keepScroll;
      // keep the red "now" line in view when the timeline is wider than its box (a phone): at open
      // (t = end) and while it plays, the box scrolls to the cursor rather than leave it off-screen
      const cx = left + state.t * unit, view = svgBox.clientWidth;
      if (view > 0 && W > view && (cx < svgBox.scrollLeft + left || cx > svgBox.scrollLeft + view - 8))
        svgBox.scrollLeft = Math.max(0, Math.min(W - view, cx - view / 2));
    }

    function drawArrows(now, p) {
      const g = svgBox.querySelector(".lx-arrows");
      if (!g || !geom) return;
      const { left, top, row, unit } = geom;
      for (const m of now) {
        const y1 = top + m.from * row + row / 2, y2 = top + m.to * row + row / 2;
        g.append(s("line", { x1: left + m.sent * unit, y1, x2: left + m.used * unit, y2,
                             class: m.what === "activation" ? "lx-msg lx-msg-act" : "lx-msg lx-msg-grad" }));
      }
    }

    new ResizeObserver(X.perFrame(() => { if (cases.get(key())) draw(); })).observe(svgBox);
    draw();
    window.addEventListener("load", () => loadGrid(), { once: true });
  };
})();

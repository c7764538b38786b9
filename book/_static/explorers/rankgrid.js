// Rank-grid explorer: choose tp/cp/ep/pp for a world size (dp is derived) and see Megatron's groups
// coloured on nodes of 8 GPUs. topology() mirrors labkit/topology.py line for line (Megatron's
// RankGenerator orders: dense tp-cp-dp-pp, experts etp-ep-edp-pp, fastest first); the browser test
// (tests/test_browser_book.py) proves its groups and its refusals equal Topology's for every layout
// this explorer offers.
(function () {
  "use strict";
  const X = window.labkitExplorers;
  const { h, num } = X;
  const ORDER = ["tp", "cp", "dp", "pp"], EXPERT_ORDER = ["etp", "ep", "edp", "pp"];
  const AXES = { tp: ["tp"], cp: ["cp"], ep: ["ep"], dp: ["dp"], pp: ["pp"], dp_cp: ["cp", "dp"],
                 mp: ["tp", "pp"], edp: ["edp"], etp: ["etp"], etp_ep: ["etp", "ep"] };
  const GPUS_PER_NODE = 8;
  const HUES = ["#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860", "#da8bc3", "#8c8c8c",
                "#ccb974", "#64b5cd", "#1b9e77", "#d95f02", "#7570b3", "#e7298a", "#66a61e", "#e6ab02"];

  // labkit.topology.Topology, as a function: throws Error with Topology's own messages.
  function topology(world, tp, pp, cp, ep, etp) {
    etp = etp == null ? tp : etp;
    const mp = tp * pp * cp;
    if (world % mp) throw new Error(`world_size ${world} is not divisible by tp*pp*cp = ${tp}*${pp}*${cp} = ${mp}`);
    const dp = world / mp;
    if (world % (etp * ep * pp)) {
      const carved = etp === tp ? `data-parallel size ${dp} x context-parallel size ${cp} is not divisible by ep ${ep}: `
        + "expert-parallel ranks are carved out of the dp x cp ranks" : "";
      throw new Error(`world_size ${world} is not divisible by etp*ep*pp = ${etp}*${ep}*${pp} (the expert grid); ${carved}`);
    }
    const sizes = { tp, cp, dp, pp, etp, ep, edp: world / (etp * ep * pp) };
    const strides = (order) => { const out = {}; let st = 1; for (const a of order) { out[a] = st; st *= sizes[a]; } return out; };
    const orderOf = (axes) => { for (const o of [ORDER, EXPERT_ORDER]) if (axes.every((a) => o.includes(a))) return o;
                                throw new Error(`axes ${axes} mix the dense and the expert grid`); };
    const enumerate = (axes, order) => { const st = strides(order); let off = [0];
      for (const a of axes) { const next = []; for (const o of off) for (let i = 0; i < sizes[a]; i++) next.push(o + i * st[a]); off = next; }
      return off; };
    function groups(axis) {
      const inner = AXES[axis], order = orderOf(inner), outer = order.filter((a) => !inner.includes(a));
      const out = enumerate(outer, order).map((b) => enumerate(inner, order).map((o) => b + o).sort((x, y) => x - y));
      return out.sort((x, y) => { for (let i = 0; i < Math.min(x.length, y.length); i++) if (x[i] !== y[i]) return x[i] - y[i]; return x.length - y.length; });
    }
    function coords(rank) {
      const st = strides(ORDER), e = strides(EXPERT_ORDER);
      const c = {}; for (const a of ORDER) c[a] = Math.floor(rank / st[a]) % sizes[a];
      c.ep = Math.floor(rank / e.ep) % sizes.ep; c.edp = Math.floor(rank / e.edp) % sizes.edp;
      return c;
    }
    return { world, ...sizes, groups, coords };
  }

  const MAX_WORLD = 512;   // drawn as buttons: 64 nodes of 8
  const LABEL = { tp: "TP", cp: "CP", dp: "DP", pp: "PP", ep: "EP", edp: "expert DP" };

  X.kinds["rank-grid"] = function (fig, body, config) {
    const st = { world: config.world_size, tp: config.tp, cp: config.cp, ep: config.ep, pp: config.pp,
                 show: config.show, selected: 0 };
    const status = h("p", { class: "lx-status", role: "status", "aria-live": "polite" });
    const grid = h("div", { class: "lx-nodes" });
    const detail = h("div", { class: "lx-detail" });
    const legend = h("p", { class: "lx-legend" });
    // any whole numbers (24 GPUs, TP 3, PP 3): the layout is checked by topology(), as Topology does
    const bad = new Map();
    const typed = (name) => (x, err) => { if (err) bad.set(name, err); else bad.delete(name); set(err ? {} : { [name]: x }); };
    const ctl = {
      world: X.intInput("world_size", "GPUs", st.world, typed("world"), { min: 1, max: MAX_WORLD }),
      tp: X.intInput("tp", "TP", st.tp, typed("tp"), { min: 1, max: MAX_WORLD }),
      cp: X.intInput("cp", "CP", st.cp, typed("cp"), { min: 1, max: MAX_WORLD }),
      pp: X.intInput("pp", "PP", st.pp, typed("pp"), { min: 1, max: MAX_WORLD }),
      ep: X.intInput("ep", "EP", st.ep, typed("ep"), { min: 1, max: MAX_WORLD }),
    };
    const radios = h("fieldset", { class: "lx-radios" }, h("legend", null, "colour the groups of"),
      ...["tp", "cp", "dp", "pp", "ep", "edp"].map((a) => {
        const id = `${fig.id}-${a}`;
        const r = h("input", { type: "radio", name: `${fig.id}-show`, id, value: a, checked: a === st.show });
        r.addEventListener("change", () => set({ show: a }));
        return h("span", { class: "lx-radio" }, r, h("label", { for: id }, LABEL[a]));
      }));
    body.append(h("div", { class: "lx-controls" }, ...Object.values(ctl)), radios, status, grid, legend, detail);

    function set(patch) { Object.assign(st, patch); draw(); }

    function draw() {
      let t;
      try {
        if (bad.size) throw new Error([...bad.values()][0]);
        t = topology(st.world, st.tp, st.pp, st.cp, st.ep);
      } catch (err) {
        // nothing of the last valid layout stays on screen: no grid, legend or group list
        status.replaceChildren(h("span", { class: "lx-error", dataset: { key: "error" } }, "invalid layout — " + err.message));
        grid.replaceChildren(); legend.replaceChildren(); detail.replaceChildren();
        fig.dataset.state = "invalid"; fig.dataset.layout = "";
        X.captionNote(fig, true);
        return;
      }
      grid.classList.remove("lx-stale");
      fig.dataset.state = "ready";
      fig.dataset.layout = JSON.stringify({ world: st.world, tp: st.tp, cp: st.cp, ep: st.ep, pp: st.pp });
      X.captionNote(fig, ["world", "tp", "cp", "ep", "pp", "show"].some((k) => st[k] !== (k === "world" ? config.world_size : config[k])));
      st.selected = Math.min(st.selected, st.world - 1);
      const groups = t.groups(st.show);
      const groupOf = new Map();
      groups.forEach((g, i) => g.forEach((r) => groupOf.set(r, i)));
      status.replaceChildren(`world ${st.world} = TP ${t.tp} × CP ${t.cp} × DP `, num("dp", t.dp, String), ` × PP ${t.pp}`,
        st.ep > 1 ? `; experts: ETP ${t.etp} × EP ${t.ep} × expert DP ${t.edp} × PP ${t.pp}` : "",
        `. ${groups.length} ${LABEL[st.show]} group${groups.length > 1 ? "s" : ""} of ${groups[0].length}.`);
      const nodes = [];
      for (let n = 0; n * GPUS_PER_NODE < st.world; n++) {
        const cells = [];
        for (let r = n * GPUS_PER_NODE; r < Math.min(st.world, (n + 1) * GPUS_PER_NODE); r++) {
          const g = groupOf.get(r), c = t.coords(r);
          const b = h("button", { type: "button", class: "lx-gpu" + (r === st.selected ? " lx-selected" : ""),
            style: `--hue:${HUES[g % HUES.length]}`, "data-rank": r, "data-group": g,
            "aria-label": `rank ${r}: tp ${c.tp}, cp ${c.cp}, dp ${c.dp}, pp ${c.pp}, ep ${c.ep}; ${LABEL[st.show]} group ${g}`,
            "aria-pressed": r === st.selected ? "true" : "false" },
            h("span", { class: "lx-gpu-rank" }, String(r)),
            h("span", { class: "lx-gpu-group" }, `g${g}`));
          b.addEventListener("click", () => set({ selected: r }));
          cells.push(b);
        }
        nodes.push(h("div", { class: "lx-node" }, h("div", { class: "lx-node-label" }, `node ${n}`), h("div", { class: "lx-node-gpus" }, cells)));
      }
      grid.replaceChildren(...nodes);
      const span = groups[0][groups[0].length - 1] - groups[0][0] + 1;
      legend.replaceChildren(`Same colour (and g-number) = one ${LABEL[st.show]} group. `,
        span <= GPUS_PER_NODE ? `Each group lies inside one node (NVLink).` : `A group spans ${span} consecutive ranks: it crosses nodes.`);
      const c = t.coords(st.selected);
      detail.replaceChildren(h("p", null, h("b", null, `rank ${st.selected}`), ` (node ${Math.floor(st.selected / GPUS_PER_NODE)}): `
        + `tp ${c.tp}, cp ${c.cp}, dp ${c.dp}, pp ${c.pp}` + (st.ep > 1 ? `, ep ${c.ep}, expert dp ${c.edp}` : "")),
        h("ul", null, ["tp", "cp", "dp", "pp", "ep", "edp"].filter((a) => a === st.show
            || (t[a] > 1 && (st.ep > 1 || (a !== "ep" && a !== "edp")))).map((a) => {
          const g = t.groups(a).find((x) => x.includes(st.selected));
          return h("li", null, `${LABEL[a]} group: `, h("span", { dataset: { key: `group_${a}`, value: JSON.stringify(g) } }, `[${g.join(", ")}]`));
        })));
    }
    draw();
  };
  X.topology = topology;
})();

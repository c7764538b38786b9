// Static-page calculators: labkit.calc itself, run in the browser by Pyodide (no kernel, no CDN).
// Pyodide's core files are vendored under _static/pyodide/; labkit's sources are copied to
// _static/labkit_src/ at build time (book/_ext/labkit_static.py). The forms come from
// labkit.calc.report.FORMS and every answer from labkit.calc.report.calculate: one source of
// formulas for the notebook widgets and this page.
(function () {
  "use strict";
  const script = document.currentScript;
  const staticURL = new URL(".", script.src).href;           // .../_static/

  function status(text, state) {
    const el = document.getElementById("labkit-calc-status");
    if (el) { el.textContent = text; el.dataset.state = state; }
  }

  function control(field) {
    const [name, label, kind, value, choices] = field;
    const wrap = document.createElement("label");
    wrap.className = "labkit-field";
    wrap.append(label + " ");
    let input;
    if (kind === "choice") {
      input = document.createElement("select");
      for (const c of choices) {
        const o = document.createElement("option");
        o.value = c; o.textContent = c; if (c === value) o.selected = true;
        input.append(o);
      }
    } else {
      input = document.createElement("input");
      if (kind === "bool") { input.type = "checkbox"; input.checked = !!value; }
      else { input.type = "number"; input.value = value; input.step = kind === "float" ? "any" : "1"; }
    }
    input.name = name;
    input.dataset.kind = kind;
    wrap.append(input);
    return wrap;
  }

  function values(form) {
    const out = {};
    for (const el of form.querySelectorAll("input, select")) {
      const kind = el.dataset.kind;
      out[el.name] = kind === "bool" ? el.checked : kind === "int" ? parseInt(el.value, 10)
        : kind === "float" ? parseFloat(el.value) : el.value;
    }
    return out;
  }

  async function main() {
    status("loading Python (Pyodide) ...", "loading");
    const pyodide = await loadPyodide({ indexURL: staticURL + "pyodide/" });
    const manifest = await (await fetch(staticURL + "labkit_src/manifest.json")).json();
    for (const rel of manifest.files) {
      const text = await (await fetch(staticURL + "labkit_src/" + rel)).text();
      const path = "/home/pyodide/" + rel;
      pyodide.FS.mkdirTree(path.substring(0, path.lastIndexOf("/")));
      pyodide.FS.writeFile(path, text);
    }
    pyodide.runPython("import sys; sys.path.insert(0, '/home/pyodide')");
    const report = pyodide.pyimport("labkit.calc.report");
    const forms = JSON.parse(pyodide.runPython("import json, labkit.calc.report as r; json.dumps(r.FORMS)"));
    for (const box of document.querySelectorAll(".labkit-calc")) {
      const name = box.dataset.calc;
      const form = document.createElement("form");
      form.className = "labkit-form";
      form.addEventListener("submit", (e) => e.preventDefault());
      for (const field of forms[name]) form.append(control(field));
      const answer = document.createElement("div");
      answer.className = "labkit-answer";
      const update = () => {
        const v = pyodide.toPy(values(form));
        answer.innerHTML = report.calculate(name, v);
        v.destroy();
        box.dataset.updates = String(parseInt(box.dataset.updates || "0", 10) + 1);
      };
      form.addEventListener("input", update);     // number, select and checkbox all fire "input"
      box.replaceChildren(form, answer);
      update();
    }
    status("ready: the calculators run labkit.calc in your browser", "ready");
  }

  main().catch((err) => { status("failed to start Python: " + err, "error"); console.error(err); });
})();

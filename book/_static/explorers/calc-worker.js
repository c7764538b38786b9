// labkit.calc in a Web Worker (Pyodide): the page stays responsive while Python starts and computes.
// Loads the vendored Pyodide (../pyodide/) and the labkit sources the build copied to ../labkit_src/
// (book/_ext/labkit_static.py), then answers {id, name, values} with
// {id, answer: labkit_answers.calculate(name, values), ms}. Posts {ready, ms} once, or {failed}.
import { loadPyodide } from "../pyodide/pyodide.mjs";

const t0 = performance.now();
const root = new URL("../", import.meta.url).href;           // .../_static/

async function start() {
  postMessage({ progress: "loading the Python runtime (about 13 MB, once)" });
  const py = await loadPyodide({ indexURL: root + "pyodide/" });
  postMessage({ progress: "loading labkit.calc" });
  const manifest = await (await fetch(root + "labkit_src/manifest.json")).json();
  await Promise.all(manifest.files.map(async (rel) => {
    const text = await (await fetch(root + "labkit_src/" + rel)).text();
    const path = "/home/pyodide/" + rel;
    py.FS.mkdirTree(path.substring(0, path.lastIndexOf("/")));
    py.FS.writeFile(path, text);
  }));
  postMessage({ progress: "importing labkit.calc" });
  py.runPython("import sys; sys.path.insert(0, '/home/pyodide')");
  const answers = py.pyimport("labkit_answers");
  const json = py.pyimport("json");
  return (name, values) => {
    const v = json.loads(JSON.stringify(values));
    try { return JSON.parse(json.dumps(answers.calculate(name, v))); } finally { v.destroy(); }
  };
}

const ready = start();
ready.then(() => postMessage({ ready: true, ms: performance.now() - t0 }),
           (err) => postMessage({ failed: String(err) }));

onmessage = async (e) => {
  const { id, name, values } = e.data;
  const calculate = await ready;
  const t = performance.now();
  let answer;
  try { answer = calculate(name, values); } catch (err) { answer = { error: "internal error: " + err }; }
  postMessage({ id, answer, ms: performance.now() - t });
};

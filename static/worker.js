// worker.js — the dedicated Web Worker that hosts Pyodide and bitlora.
//
// Boots Pyodide from this server (never a CDN), installs micropip/packaging from
// local wheels, then the bitlora wheel that `bitlora serve` built from the tree.
// Messages in:  {type: "run", id, code}   run Python (async), answer with its result
//               {type: <other>, ...}       handed to bitlora.webapp.dispatch(msg)
//                                          (with an id: a request, answered with that id)
// Messages out: {type: "boot", stage, text} while starting; {type: "ready", version};
//               {type: "result", id, ok, value | error}; whatever Python posts.
// self.bitloraReplay: static/replay.js's replay, which the browser backend calls to
// encode a recorded step (gpu/browser.py; without it, it encodes from Python).
import { loadPyodide } from "/pyodide/pyodide.mjs";
import { replay } from "./replay.js";

self.bitloraReplay = replay;

const post = (msg) => self.postMessage(msg);
let pyodide = null;
let dispatch = null;   // bitlora.webapp.dispatch: one proxy for the worker's life (not one a message)

async function boot() {
  post({ type: "boot", stage: "pyodide", text: "Loading Python (Pyodide)…" });
  pyodide = await loadPyodide({
    indexURL: new URL("/pyodide/", self.location.href).href,
    stdout: (text) => post({ type: "log", level: "info", text }),
    stderr: (text) => post({ type: "log", level: "error", text }),
  });
  post({ type: "boot", stage: "packages", text: "Installing packages…" });
  // Pure-Python wheels fetched from PyPI at set-up; loaded by URL because their
  // hashes differ from the rebuilt ones named in pyodide-lock.json.
  const base = new URL("/pyodide/", self.location.href).href;
  await pyodide.loadPackage([base + "micropip-0.11.1-py3-none-any.whl",
                             base + "packaging-26.1-py3-none-any.whl"]);
  const meta = await (await fetch("/bitlora.json")).json();
  const micropip = pyodide.pyimport("micropip");
  await micropip.install.callKwargs(new URL(meta.wheel, self.location.href).href, { deps: false });
  micropip.destroy();
  const webapp = pyodide.pyimport("bitlora.webapp");
  dispatch = webapp.dispatch.copy();
  webapp.destroy();
  post({ type: "ready", version: meta.version });
}

const booted = boot().catch((err) => {
  post({ type: "fatal", text: `Python failed to start: ${err && err.message ? err.message : err}` });
  throw err;
});

async function runCode(msg) {
  const globals = pyodide.globals.get("dict")();
  try {
    const value = await pyodide.runPythonAsync(msg.code, { globals });
    const out = value && typeof value.toJs === "function" ? String(value) : value;
    post({ type: "result", id: msg.id, ok: true, value: out === undefined ? null : out });
  } catch (err) {
    post({ type: "result", id: msg.id, ok: false, error: String(err && err.message ? err.message : err) });
  } finally {
    globals.destroy();
  }
}

self.onmessage = async (event) => {
  const msg = event.data;
  try {
    await booted;
  } catch {
    return;
  }
  if (!msg || typeof msg.type !== "string") {
    post({ type: "error", text: "worker: message without a type" });
  } else if (msg.type === "run") {
    await runCode(msg);
  } else {
    // Proxies are destroyed as soon as they are done with: one left to the garbage
    // collector keeps its Python object until a collection finalizes it (the soak in
    // bench/soak.py saw the module proxy of a per-message pyimport pile up that way).
    const arg = pyodide.toPy(msg);
    try {
      await dispatch(arg);
    } catch (err) {
      post({ type: "error", text: String(err && err.message ? err.message : err), request: msg.type, id: msg.id });
    } finally {
      if (arg && typeof arg.destroy === "function") arg.destroy();
    }
  }
};

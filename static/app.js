// app.js — the page: starts the Python worker and shows what it reports.
import { PyWorker } from "./client.js";

const $ = (id) => document.getElementById(id);
const status = $("status");

function setStatus(text, isError = false) {
  status.textContent = text;
  status.classList.toggle("error", isError);
}

const handlers = {
  boot: (msg) => setStatus(msg.text),
  ready: () => { setStatus("Python ready; running a WGSL kernel on WebGPU…"); py.send({ type: "hello", n: 8 }); },
  fatal: (msg) => setStatus(msg.text, true),
  "gpu-error": (msg) => setStatus(msg.text, true),
  error: (msg) => setStatus(`Error: ${msg.text}`, true),
  log: (msg) => console.log(`[py] ${msg.text}`),
  result: () => {},
  hello: (msg) => {
    $("adapter").textContent = msg.adapter;
    $("binding-limit").textContent = `${(msg.limits.maxStorageBufferBindingSize / 2 ** 20).toFixed(0)} MiB`;
    $("kernel-result").textContent = `x = [${msg.x.join(", ")}]\ny = [${msg.y.join(", ")}]`;
    setStatus("WebGPU works: the kernel ran in the worker.");
  },
};

const py = new PyWorker((msg) => {
  const handler = handlers[msg.type];
  if (handler) handler(msg);
  else console.warn("unknown message from worker", msg);
});
py.ready.catch((err) => setStatus(err.message, true));

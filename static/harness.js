// harness.js — exposes the worker to Playwright as window.bitlora (see app/browser.py).
import { PyWorker } from "./client.js";

const status = document.getElementById("status");
const py = new PyWorker((msg) => {
  if (msg.type === "boot") status.textContent = msg.text;
  if (msg.type === "log") console.log(`[py] ${msg.text}`);
  if (msg.id === undefined && self.bitloraMessage) self.bitloraMessage(msg);   // BrowserSession.on_message
});
window.bitlora = {
  ready: py.ready.then((m) => { status.textContent = "ready"; return m; }),
  run: (code, timeoutMs) => py.run(code, timeoutMs),
  request: (msg, timeoutMs) => py.request(msg, timeoutMs),
  get state() { return py.state; },
};

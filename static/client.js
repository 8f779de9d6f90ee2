// client.js — the page's side of the worker: start it, send messages, await results.
// No math here: Python in the worker does the work, this only moves messages.

export class PyWorker {
  constructor(onMessage = () => {}) {
    this.worker = new Worker(new URL("./worker.js", import.meta.url), { type: "module" });
    this.pending = new Map();
    this.nextId = 1;
    this.state = "booting";
    this.ready = new Promise((resolve, reject) => {
      this.worker.onmessage = (event) => {
        const msg = event.data;
        if (msg.type === "ready") { this.state = "ready"; resolve(msg); }
        if (msg.type === "fatal") { this.state = "failed"; reject(new Error(msg.text)); }
        if (msg.id !== undefined && this.pending.has(msg.id)) {
          const { resolve: done } = this.pending.get(msg.id);
          this.pending.delete(msg.id);
          done(msg);
        }
        onMessage(msg);
      };
      this.worker.onerror = (event) => {
        this.state = "failed";
        reject(new Error(event.message || "the worker failed to start"));
      };
    });
  }

  // Send a message and resolve to the one answering it (the same id): a "run" gets
  // {type: "result", ok, value | error}, a handler's request its reply or
  // {type: "error", text}. Fails loudly on timeout, in both shapes.
  request(msg, timeoutMs = 600000) {
    const id = this.nextId++;
    return new Promise((resolve) => {
      const timer = setTimeout(() => {
        this.pending.delete(id);
        const text = `${msg.type}: timed out after ${timeoutMs} ms`;
        resolve({ type: "error", id, ok: false, error: text, text });
      }, timeoutMs);
      this.pending.set(id, { resolve: (answer) => { clearTimeout(timer); resolve(answer); } });
      this.worker.postMessage({ ...msg, id });
    });
  }

  // Run Python code in the worker; resolves to {ok, value | error}.
  run(code, timeoutMs = 600000) {
    return this.request({ type: "run", code }, timeoutMs);
  }

  send(msg) {
    this.worker.postMessage(msg);
  }
}

"""Soak: many optimizer steps of the demo model on a few demo records with small
settings, watching for leaks, natively or through the web page in headless Chromium.
Every `every` steps (after a full garbage collection) it records the GPU buffer bytes
and count (Device.allocated, Device.live_buffers), the bind-group cache, the trainer's
recorded programs (one per micro-batch shape, gpu.Programs) and the Python heap
(tracemalloc). The trainer's metrics history grows by design (one row per step, for
the charts and the checkpoint); its bytes are counted apart and left out of the heap
figure. In the page it also records the worker's wasm memory (Pyodide's heap, which
never shrinks) and the V8 heaps of the worker and of the page (see JsHeaps).

    .venv/bin/python -m bitlora.bench.soak --steps 2000     # figures in docs/RELIABILITY.md
    .venv/bin/python -m bitlora.bench.soak --browser --steps 200

Growth is measured from the end of the warm-up (one epoch: every sequence length has
been seen, so the bind-group cache, keyed by buffer ranges, and the programs are full) to the largest
value after it. tests/test_soak.py runs a short version with the same 2 % bound.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
import tracemalloc

from bitlora.data import load_records
from bitlora.demo import MODEL_DIR
from bitlora.model import load_model
from bitlora.train import Trainer

SETTINGS = dict(micro_batch_size=1, grad_accum=1, cutoff_len=64, lr=1e-3, warmup_steps=0, lora_r=4)
MEASURES = ("gpu_bytes", "gpu_buffers", "bind_groups", "programs", "heap")


def _metrics_bytes(rows: list) -> int:
    return sys.getsizeof(rows) + sum(sys.getsizeof(r) + sum(sys.getsizeof(v) for v in r.values()) for r in rows)


def soak(steps: int, records: int = 20, every: int = 10, model=None) -> dict:
    """Train `steps` optimizer steps on the first `records` demo records (an epoch is
    `records` steps) and sample every `every` steps: {"rows": [...], "warmup": step,
    "growth": {measure: fraction}, "seconds"}."""
    tracemalloc.start()
    model = model or load_model(str(MODEL_DIR))
    data = [r for r in load_records("demo")][:records]
    tr = Trainer(model, data, dict(SETTINGS, max_steps=steps, epochs=steps // records + 1))
    dev, rows = model.dev, []

    def sample(row):
        if row["step"] % every:
            return
        gc.collect()
        kept = _metrics_bytes(tr.metrics)
        rows.append({"step": row["step"], "gpu_bytes": dev.allocated, "gpu_buffers": dev.live_buffers,
                     "bind_groups": len(dev._bind_groups), "programs": len(tr.programs),
                     "heap": tracemalloc.get_traced_memory()[0] - kept,
                     "metrics_bytes": kept, "loss": row["loss"]})
    tr.on_step = sample
    t0 = time.perf_counter()
    try:
        tr.train()
    finally:
        tracemalloc.stop()
        tr.close()
    warm = next(r for r in rows if r["step"] >= min(records + every, steps // 2))
    growth = {m: (max(r[m] for r in rows if r["step"] >= warm["step"]) - warm[m]) / warm[m] for m in MEASURES}
    return {"rows": rows, "warmup": warm["step"], "growth": growth, "seconds": time.perf_counter() - t0}


# -- in the page ------------------------------------------------------------------------

# Run in the page's worker (?test-hooks) before Train: every `every` steps the run
# pauses at the top of its loop (Control.wait), where the worker has nothing else to
# do; there it takes its figures after a full collection, leaves them in the worker's
# global `bitloraSoak` and waits for `bitloraSoakGo()`. The soak reads and resumes
# through the DevTools protocol, so that nothing of the page's own message channel
# (which the run does not use either) is counted.
SAMPLER = """
import gc, json, sys, tracemalloc
import js, pyodide_js
from pyodide.ffi import create_once_callable
from bitlora import train, webapp

METRICS_BYTES

def _soak_on_step(row, total, _plain=webapp._step_message):
    if row["step"] % EVERY == 0:
        webapp.S.trainer.pause()
    return _plain(row, total)

def _soak_figures():
    tr = webapp.S.trainer
    gc.collect()
    kept = _metrics_bytes(tr.metrics)
    dev = tr.model.dev
    return json.dumps({"step": tr.step, "gpu_bytes": dev.allocated, "gpu_buffers": dev.live_buffers,
        "bind_groups": len(dev._bind_groups), "programs": len(tr.programs) if tr.programs is not None else 0,
        "heap": tracemalloc.get_traced_memory()[0] - kept,
        "metrics_bytes": kept, "wasm": pyodide_js._module.HEAP8.length, "loss": tr.metrics[-1]["loss"]})

def _soak_go(resolve, reject):
    js.self.bitloraSoakGo = resolve

async def _soak_wait(self):
    go = js.Promise.new(create_once_callable(_soak_go))
    js.self.bitloraSoak = _soak_figures()
    await go
    js.self.bitloraSoak = ""
    self.resume()

js.self.bitloraSoak = ""
js.self.bitloraSoakFigures = create_once_callable(_soak_figures)
webapp._step_message = _soak_on_step
train.Control.wait = _soak_wait
tracemalloc.start()
"installed"
"""


class JsHeaps:
    """The V8 heaps of a page and of its Web Worker, in use after a full garbage
    collection, read through Chromium's DevTools protocol (HeapProfiler.collectGarbage,
    Runtime.getHeapUsage). A page script cannot read them here: `performance.memory`
    exists on the page but not in a worker, and `performance.measureUserAgentSpecificMemory`
    needs a cross-origin isolated page (COEP), which the app is not. Playwright opens
    protocol sessions on pages only, so the worker's goes through the browser's
    session (Target.attachToTarget without flatten, Target.sendMessageToTarget)."""

    def __init__(self, page, timeout_s: float = 60.0):
        self.page, self.timeout_s = page, timeout_s
        self.page_cdp = page.context.new_cdp_session(page)
        me = self.page_cdp.send("Target.getTargetInfo")["targetInfo"]["targetId"]
        self.cdp = page.context.browser.new_browser_cdp_session()
        workers = [t["targetId"] for t in self.cdp.send("Target.getTargets")["targetInfos"]
                   if t["type"] == "worker" and me in (t.get("parentFrameId"), t.get("openerId"))]
        if len(workers) != 1:
            raise RuntimeError(f"expected the page's one worker, found {len(workers)}")
        self.answers, self.next_id = {}, 0
        self.cdp.on("Target.receivedMessageFromTarget", self._received)
        self.sid = self.cdp.send("Target.attachToTarget", {"targetId": workers[0], "flatten": False})["sessionId"]

    def _received(self, event):
        msg = json.loads(event["message"])
        if "id" in msg:
            self.answers[msg["id"]] = msg

    def _worker(self, method: str, params: dict | None = None) -> dict:
        self.next_id += 1
        self.cdp.send("Target.sendMessageToTarget", {"sessionId": self.sid, "message": json.dumps(
            {"id": self.next_id, "method": method, "params": params or {}})})
        end = time.monotonic() + self.timeout_s
        while self.next_id not in self.answers:
            if time.monotonic() > end:
                raise TimeoutError(f"the worker did not answer {method} in {self.timeout_s:.0f} s")
            self.page.wait_for_timeout(5)
        answer = self.answers.pop(self.next_id)
        if "error" in answer:
            raise RuntimeError(f"{method}: {answer['error']}")
        return answer["result"]

    def evaluate(self, expr: str):
        """A JS expression's value in the worker's global scope (DevTools' own
        evaluation: not the page's code, so its policy does not apply)."""
        res = self._worker("Runtime.evaluate", {"expression": expr, "returnByValue": True, "awaitPromise": True})
        if "exceptionDetails" in res:
            raise RuntimeError(f"{expr}: {res['exceptionDetails'].get('text')}")
        return res["result"].get("value")

    def sample(self) -> dict:
        self._worker("HeapProfiler.collectGarbage")
        self.page_cdp.send("HeapProfiler.collectGarbage")
        return {"js_heap": self._worker("Runtime.getHeapUsage")["usedSize"],
                "page_heap": self.page_cdp.send("Runtime.getHeapUsage")["usedSize"]}

    def close(self):
        for s in (self.cdp, self.page_cdp):
            try:
                s.detach()
            except Exception:  # noqa: BLE001 - the page may be gone
                pass


BROWSER_MEASURES = MEASURES + ("wasm", "js_heap", "page_heap")


def browser_soak(steps: int, records: int = 20, every: int = 1, session=None, save_every: int = 10) -> dict:
    """The soak through the web page in headless Chromium (its own, or `session`, an
    app.browser.BrowserSession): the first `records` demo records uploaded as a
    dataset file, the demo model, Train with SETTINGS. Returns what soak() returns,
    with the BROWSER_MEASURES."""
    import inspect
    import tempfile
    from bitlora.app.browser import BrowserSession

    own = session is None
    session = session or BrowserSession().start()
    page = session.new_page()
    heaps = None
    try:
        page.goto(session.server.url + "?test-hooks")
        page.locator("#kernel-result", has_text="y = [").wait_for(timeout=180_000)
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, f"soak-{records}.json")
            with open(path, "w") as f:
                json.dump(load_records("demo")[:records], f)
            page.get_by_label("Dataset file").set_input_files(path)
            page.locator("#data-summary", has_text=f"{records} records").wait_for(timeout=60_000)
        page.get_by_role("button", name="Load demo model").click()
        page.get_by_role("status").filter(has_text="Model loaded").wait_for(timeout=120_000)
        settings = dict(SETTINGS, max_steps=steps, epochs=steps // records + 1, save_every=save_every)
        for name, val in settings.items():
            page.locator(f"#settings [name={name}]").fill(str(val))
        page.locator("#settings [name=lr]").dispatch_event("change")
        code = SAMPLER.replace("METRICS_BYTES", inspect.getsource(_metrics_bytes)).replace("EVERY", str(every))
        _page_run(page, code)
        heaps = JsHeaps(page)
        rows = []
        t0 = time.perf_counter()
        page.get_by_role("button", name="Train", exact=True).click()
        while True:
            got = heaps.evaluate("self.bitloraSoak")
            if got:
                rows.append(dict(json.loads(got), **heaps.sample()))
                heaps.evaluate("self.bitloraSoak = ''; self.bitloraSoakGo(); 0")
                continue
            states = page.evaluate("() => bitloraTest.messages.splice(0).filter((m) => m.type === 'train-state' "
                                   "|| m.type === 'error').map((m) => [m.state || 'error', m.text || ''])")
            bad = [s for s in states if s[0] in ("failed", "error")]
            if bad:
                raise RuntimeError(f"the page's training failed: {bad}")
            if any(s[0] in ("done", "stopped") for s in states):
                break
            page.wait_for_timeout(10)
        seconds = time.perf_counter() - t0
        # the last step does not pause (no step follows): its figures once the page is idle
        rows.append(dict(json.loads(heaps.evaluate("self.bitloraSoakFigures()")), **heaps.sample()))
    finally:
        if heaps is not None:
            heaps.close()
        page.close()
        if own:
            session.close()
    if [r["step"] for r in rows] != list(range(every, steps, every)) + [steps]:
        raise RuntimeError(f"the soak sampled steps {[r['step'] for r in rows]}, not every {every} up to {steps}")
    warm = next(r for r in rows if r["step"] >= min(records + every, steps // 2))
    growth = {m: (max(r[m] for r in rows if r["step"] >= warm["step"]) - warm[m]) / warm[m] for m in BROWSER_MEASURES}
    return {"rows": rows, "warmup": warm["step"], "growth": growth, "seconds": seconds}


def _page_run(page, code: str):
    res = page.evaluate("(code) => bitloraTest.run(code, 60000)", code)
    if not res["ok"]:
        raise RuntimeError(f"Python in the page's worker failed: {res['error']}")
    return res["value"]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bitlora.bench.soak", description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=None, help="optimizer steps (default 2000, in the page 200)")
    p.add_argument("--records", type=int, default=20, help="demo records trained on (one epoch = this many steps)")
    p.add_argument("--every", type=int, default=None, help="sample every N steps (default 10, in the page 1)")
    p.add_argument("--browser", action="store_true", help="through the web page in headless Chromium")
    args = p.parse_args(argv)
    if args.browser:
        steps, every = args.steps or 200, args.every or 1
        res, cols = browser_soak(steps, args.records, every), BROWSER_MEASURES
    else:
        steps, every = args.steps or 2000, args.every or 10
        res, cols = soak(steps, args.records, every), MEASURES
    cols = cols + ("metrics_bytes",)
    print("step " + " ".join(f"{c:>13}" for c in cols) + "    loss")
    rows = res["rows"]
    for r in rows[:: max(1, len(rows) // 20)] + rows[-1:]:
        print(f"{r['step']:4d} " + " ".join(f"{r[c]:13d}" for c in cols) + f"  {r['loss']:.4f}")
    print(f"{steps} steps in {res['seconds']:.0f} s; growth after step {res['warmup']}: "
          + ", ".join(f"{m} {100 * g:+.2f} %" for m, g in res["growth"].items()))
    return 0 if all(g < 0.02 for g in res["growth"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())

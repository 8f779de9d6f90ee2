"""Faults in the web app, in headless Chromium with real WebGPU: a reload in mid-training,
the GPU device lost, NaN/Inf steps, browser storage full. Each test trains the demo
model a few steps (SwiftShader is slow) with checkpoints every 2 steps.

The page is opened with ?test-hooks: then `window.bitloraTest.messages` holds every
message from the worker (the tests read step losses there) and `bitloraTest.run`
runs Python in the worker (used once, to destroy the GPU device)."""
import statistics
import time

import pytest

from test_app import ARTIFACTS, _fill, held, hold, pyrun, release

pytestmark = pytest.mark.browser   # headless Chromium: skipped by -m "not browser"

SETTINGS = dict(micro_batch_size=1, grad_accum=1, cutoff_len=64, lr=0.003, warmup_steps=0, save_every=2)
# Steps per run. A reload, a poison or a lost device lands in mid-run because the test
# holds training at a step (test_app.hold) while it acts.
STEPS = 8


def open_app(session, page=None):
    page = page or session.new_page()
    page.set_viewport_size({"width": 1300, "height": 1600})
    page.goto(session.server.url + "?test-hooks")
    page.locator("#kernel-result", has_text="y = [").wait_for(timeout=120_000)
    return page


def shot(page, name):
    page.screenshot(path=str(ARTIFACTS / f"faults-{name}.png"), full_page=False)


def reload(page):
    page.reload()
    page.locator("#kernel-result", has_text="y = [").wait_for(timeout=120_000)


def load_demo(page):
    page.get_by_role("button", name="Load demo model").click()
    page.get_by_role("status").filter(has_text="Model loaded").wait_for(timeout=120_000)
    page.get_by_role("button", name="Load demo dataset").click()
    page.locator("#data-summary", has_text="usable").wait_for(timeout=60_000)


def train_demo_steps(page, steps: int):
    """Load the demo model and dataset, train `steps` steps with SETTINGS, wait for the end."""
    load_demo(page)
    _fill(page, max_steps=steps, **SETTINGS)
    page.get_by_role("button", name="Train", exact=True).click()
    page.get_by_role("status").filter(has_text="finished").wait_for(timeout=300_000)


def messages(page, kind):
    """The worker's messages of one type, their plain (non-object) fields only."""
    return page.evaluate("(k) => bitloraTest.messages.filter((m) => m.type === k).map((m) => "
                         "Object.fromEntries(Object.entries(m).filter(([, v]) => typeof v !== 'object' || v === null)))",
                         kind)


def losses(page):
    return {m["step"]: m["loss"] for m in messages(page, "step")}


def wait_for(page, kind, pred, timeout_s=300):
    """The first message of `kind` that satisfies `pred`; fails once the run is over without one."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        over = any(m.get("state") in ("done", "failed", "stopped") for m in messages(page, "train-state"))
        hits = [m for m in messages(page, kind) if pred(m)]
        if hits:
            return hits[0]
        if over:
            break
        page.wait_for_timeout(200)
    raise AssertionError(f"no {kind!r} message as expected; status: {page.get_by_role('status').text_content()!r}")


def offered_step(page):
    """Wait for the resume offer; return the checkpoint step it names."""
    page.get_by_role("button", name="Resume training").wait_for(timeout=120_000)
    return wait_for(page, "checkpoint", lambda m: m.get("available"))["step"]


def click_latencies(page, n=8):
    """Real mouse clicks (through the browser's input pipeline) on a heading: ms from
    the input event's time stamp to its handler running on the page's main thread."""
    page.evaluate("() => { window.__lat = []; document.getElementById('train-h').addEventListener('click', "
                  "(e) => window.__lat.push(performance.now() - e.timeStamp)); }")
    box = page.locator("#train-h").bounding_box()
    for _ in range(n):
        page.mouse.click(box["x"] + 5, box["y"] + 5)
        page.wait_for_timeout(250)
    return page.evaluate("() => window.__lat")


def test_reload_mid_training_then_resume_continues_the_curve(browser_session):
    """Reload in mid-run, after a checkpoint: the page offers the stored run; resuming
    keeps the earlier points and recomputes the lost steps exactly. The run is held at
    step HELD (after the step HELD - 2 checkpoint) while the page reloads."""
    steps, at = 40, 38
    page = open_app(browser_session)
    try:
        load_demo(page)
        _fill(page, max_steps=steps, **SETTINGS)
        hold(page, at)
        page.get_by_role("button", name="Train").click()
        wait_for(page, "step", lambda m: m["step"] == 1)
        lat = click_latencies(page)
        ran = max(losses(page))
        print(f"\nclick latency while training (steps 1-{ran} landed meanwhile): median "
              f"{statistics.median(lat):.1f} ms, max {max(lat):.1f} ms ({len(lat)} clicks)")
        assert len(lat) == 8 and max(lat) < 1000, lat
        held(page)
        saved = max(m["step"] for m in messages(page, "checkpoint") if m.get("saved"))
        before = losses(page)
        assert saved == at - 2 and sorted(before) == list(range(1, at)), (saved, sorted(before))
        reload(page)
        ckpt = offered_step(page)
        assert ckpt == saved, (saved, ckpt)
        shot(page, "reload-offers-resume")
        page.get_by_role("button", name="Resume training").click()
        page.get_by_role("status").filter(has_text="finished").wait_for(timeout=300_000)
        after = losses(page)
        assert sorted(after) == list(range(ckpt + 1, steps + 1)), after  # continues from the checkpoint
        chart = page.locator("#chart-loss")
        assert chart.get_attribute("data-points") == str(steps)          # earlier points kept
        assert float(chart.get_attribute("data-first")) == before[1]
        for step in set(before) & set(after):                            # a lost step comes out the same
            assert after[step] == before[step], (step, before[step], after[step])
        assert set(before) & set(after) == {at - 1}
        print(f"checkpoint {ckpt}, steps before reload 1-{max(before)}, recomputed equal: "
              f"{sorted(set(before) & set(after))}")
    finally:
        page.close()


def test_gpu_device_lost_offers_resume_and_loses_at_most_save_every(browser_session):
    """The device is destroyed while step 4 is held (checkpoint at step 2): the page
    offers the step-2 checkpoint, and resuming recomputes step 3 exactly."""
    page = open_app(browser_session)
    try:
        load_demo(page)
        _fill(page, max_steps=STEPS, **SETTINGS)
        hold(page, 4)
        page.get_by_role("button", name="Train").click()
        held(page)
        before = losses(page)
        assert sorted(before) == [1, 2, 3]
        assert pyrun(page, "from bitlora import webapp\nwebapp.S.model.dev.backend.device.destroy()\n'destroyed'")
        release(page)
        page.get_by_role("status").filter(has_text="GPU device was lost").wait_for(timeout=120_000)
        page.locator("#banner-text", has_text="GPU device was lost").wait_for(timeout=60_000)
        ckpt = offered_step(page)
        assert ckpt == 2, (ckpt, sorted(before))                          # at most save_every steps lost
        shot(page, "device-lost")
        page.get_by_role("button", name="Resume training").click()
        page.get_by_role("status").filter(has_text="finished").wait_for(timeout=300_000)
        after = {s: v for s, v in losses(page).items() if s > ckpt}
        assert page.locator("#chart-loss").get_attribute("data-points") == str(STEPS)
        assert sorted(after)[0] == ckpt + 1 and max(after) == STEPS
        for step in set(before) & set(after):
            assert after[step] == before[step], (step, before[step], after[step])
        print(f"\nlost in step 4 after {max(before)} steps, resumed from checkpoint {ckpt}")
    finally:
        page.close()


# A NaN written into the first LoRA weight: from the next step on, the gradients are
# not finite (the forward's loss may stay finite: WGSL's max/clamp may drop a NaN).
# A huge lr does not do it: with lr 1e30 the LoRA output saturates the sub-norms and
# the gradients vanish, natively too, instead of overflowing.
POISON = """
import array
from bitlora import webapp
tr = webapp.S.trainer
tr.model.dev.write(tr.lora.arena.params, array.array("f", [float("nan")]), 0)
"poisoned"
"""


def test_non_finite_steps_are_skipped_counted_and_shown(browser_session):
    """While step 2 is held a test hook puts a NaN into the LoRA weights: every later
    step has NaN gradients; AdamW skips them on the GPU, the run finishes, and the page
    shows the count."""
    page = open_app(browser_session)
    try:
        load_demo(page)
        _fill(page, max_steps=STEPS, **SETTINGS)
        hold(page, 2)
        page.get_by_role("button", name="Train").click()
        held(page)
        assert pyrun(page, POISON) == "poisoned"
        release(page)
        page.get_by_role("status").filter(has_text="finished").wait_for(timeout=300_000)
        steps = messages(page, "step")
        skipped = steps[-1]["skipped"]
        print(f"\nskipped counts per step: {[m['skipped'] for m in steps]}, losses {[m['loss'] for m in steps]}")
        assert [m["step"] for m in steps] == list(range(1, STEPS + 1))
        assert [m["skipped"] for m in steps] == list(range(STEPS))        # every step after the NaN
        assert page.locator("#skipped-steps").text_content() == f"Skipped steps (NaN/Inf gradients): {skipped}"
        assert "non-finite" in page.locator("#log").text_content()
        shot(page, "non-finite-steps")
    finally:
        page.close()


# Make IndexedDB refuse the training-state file the way a full disk does (a real
# QuotaExceededError DOMException, thrown by store.put), while the other files of
# the checkpoint (session.json, the adapter) still go through: the worst partial
# write. Browsers' own quota overrides (DevTools' Storage.overrideQuotaForOrigin)
# did not take effect in Playwright's contexts here.
FILL_STORAGE = """
import js
from pyodide.ffi import create_proxy
proto = js.IDBObjectStore.prototype
js.self.bitloraPut = proto.put

def put(this, entry, path, *rest):
    if str(path).endswith("training_state.safetensors"):
        js.crypto.getRandomValues(js.Uint8Array.new(65537))   # throws QuotaExceededError
    return js.self.bitloraPut.call(this, entry, path, *rest)

proto.put = create_proxy(put, capture_this=True)
"ok"
"""


def test_storage_full_keeps_training_and_the_previous_checkpoint(browser_session):
    """After the step-2 checkpoint, IndexedDB refuses the state file: the step-4
    checkpoint is not stored, the page says so and training finishes; after a reload
    the offer names step 2 — the previous training state survived (its own step, not
    the newer session.json that did get through, decides)."""
    page = open_app(browser_session)
    try:
        load_demo(page)
        _fill(page, max_steps=4, **SETTINGS)
        hold(page, 3)
        page.get_by_role("button", name="Train").click()
        held(page)
        wait_for(page, "checkpoint", lambda m: m.get("saved") and m["step"] == 2)
        assert pyrun(page, FILL_STORAGE) == "ok"
        release(page)
        failed = wait_for(page, "checkpoint", lambda m: m.get("saved") is False)
        print(f"\n{failed['text']}")
        assert failed["step"] == 4 and "not saved" in failed["text"] and "step 2" in failed["text"]
        assert "QuotaExceededError" in failed["text"]
        page.locator("#banner-text", has_text="not saved").wait_for(timeout=10_000)
        page.get_by_role("status").filter(has_text="finished").wait_for(timeout=300_000)
        assert sorted(losses(page)) == [1, 2, 3, 4]                      # training went on
        reload(page)
        assert offered_step(page) == 2
    finally:
        page.close()


# A GPU memory budget for the worker's device (Device.memory_limit): what the model and
# other buffers use now, minus the finished run's buffers (a new run frees them), plus
# half of what a run with the same settings needs.
LIMIT = """
from bitlora import webapp
tr = webapp.S.trainer
dev = tr.model.dev
base = dev.allocated - sum(b.size for b in tr._buffers)
dev.memory_limit = base + (tr.memory_estimate()["total"] - tr.model.weight_bytes) // 2
dev.memory_limit
"""

# A real WebGPU out-of-memory error, as the device reports one it cannot pin to a call
# (another tab took the memory): a GPUOutOfMemoryError in an uncapturederror event.
OOM_EVENT = """
import js
from bitlora import webapp
dev = webapp.S.trainer.model.dev
dev.memory_limit = None
err = js.GPUOutOfMemoryError.new("test: allocation failed")
init = js.Object.fromEntries([["error", err]])
dev.backend.device.dispatchEvent(js.GPUUncapturedErrorEvent.new("uncapturederror", init))
"sent"
"""


def test_out_of_gpu_memory_says_what_fits_keeps_the_checkpoint_and_the_page(browser_session):
    """A 2-step run saves a checkpoint; then the worker's device gets a memory budget
    half of what the next run needs: Train stops with a message naming the buffer and
    the settings that fit, the step-2 checkpoint is still offered, Train works again.
    Then a WebGPU GPUOutOfMemoryError in mid-run stops that run the same way."""
    page = open_app(browser_session)
    try:
        train_demo_steps(page, 2)
        res = page.evaluate("(code) => bitloraTest.run(code, 60000)", LIMIT)
        assert res["ok"], res
        page.evaluate("() => { bitloraTest.messages.length = 0; }")
        page.get_by_role("button", name="Train", exact=True).click()
        status = page.get_by_role("status").filter(has_text="Out of GPU memory")
        status.wait_for(timeout=120_000)
        text = status.text_content()
        print(f"\n{text}")
        assert "does not fit" in text and "Settings that fit" in text
        assert offered_step(page) == 2                                    # the checkpoint is intact
        assert page.get_by_role("button", name="Train", exact=True).is_enabled()
        page.evaluate("() => { bitloraTest.messages.length = 0; }")
        _fill(page, max_steps=3)
        page.evaluate("(code) => bitloraTest.run(code, 60000)", "from bitlora import webapp\n"
                      "webapp.S.model.dev.memory_limit = None")
        hold(page, 2)
        page.get_by_role("button", name="Train", exact=True).click()               # the page still trains
        held(page)
        assert pyrun(page, OOM_EVENT) == "sent"
        release(page)
        status = page.get_by_role("status").filter(has_text="Out of GPU memory")
        status.wait_for(timeout=120_000)
        print(status.text_content())
        assert "WebGPU" in status.text_content() and "test: allocation failed" in status.text_content()
        page.get_by_role("button", name="Train", exact=True).wait_for(timeout=10_000)
        assert page.get_by_role("button", name="Train", exact=True).is_enabled()
    finally:
        page.close()

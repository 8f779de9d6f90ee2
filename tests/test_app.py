"""The web app in headless Chromium: real worker, real Pyodide, real file inputs."""
import json
import pathlib
import re
import time

import pytest

pytestmark = pytest.mark.browser   # headless Chromium: skipped by -m "not browser"

ARTIFACTS = pathlib.Path(__file__).resolve().parent.parent / "test-artifacts"
ARTIFACTS.mkdir(exist_ok=True)

XSS = '<img src=x onerror="window.__xss = 1">'


@pytest.fixture
def app(browser_session):
    page = browser_session.new_page()
    page.set_viewport_size({"width": 1300, "height": 1600})
    page.goto(browser_session.server.url + "?test-hooks")
    page.locator("#kernel-result", has_text="y = [").wait_for(timeout=120_000)
    yield page
    page.close()


# An action that must land in mid-run (Pause, Stop, Export, a reload, a fault) waits for
# the worker's test hold (webapp.Hold, armed through ?test-hooks): training waits as a
# given micro-batch starts until the test releases it, whatever the device's speed.

def pyrun(page, code: str, timeout_s: float = 60):
    """Run Python in the page's worker (?test-hooks); its last expression, a str."""
    res = page.evaluate("([code, ms]) => bitloraTest.run(code, ms)", [code, int(timeout_s * 1000)])
    assert res["ok"], res
    return res["value"]


def hold(page, step: int, micro: int = 0):
    """Training will wait as micro-batch `micro` of step `step` starts; a hold armed
    before is released."""
    pyrun(page, f"from bitlora import webapp\nold, webapp.S.hold = webapp.S.hold, webapp.Hold({step}, {micro})\n"
                "old and old.release()\n'armed'")


def held(page, timeout_s: float = 300):
    """Wait until training waits at the hold; fail if the run ends first."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if pyrun(page, "from bitlora import webapp\nstr(webapp.S.hold.reached.is_set())") == "True":
            return
        if page.evaluate("() => bitloraTest.messages.some((m) => m.type === 'train-state' "
                         "&& ['done', 'failed', 'stopped'].includes(m.state))"):
            break
        page.wait_for_timeout(100)
    raise AssertionError(f"training never reached the hold; status: {page.get_by_role('status').text_content()!r}")


def release(page):
    pyrun(page, "from bitlora import webapp\nwebapp.S.hold.release()")


def test_dataset_upload_shows_counts_preview_and_invalid_records_as_text(app, tmp_path):
    records = [
        {"instruction": XSS, "input": "", "output": "fine"},
        {"instruction": "no output here", "input": ""},
        {"instruction": "Say hi.", "input": "", "output": 42},
        {"instruction": "Say hi.", "input": "", "output": "hi"},
    ]
    path = tmp_path / "mine.json"
    path.write_text(json.dumps(records))
    app.get_by_label("Dataset file").set_input_files(str(path))
    summary = app.locator("#data-summary", has_text="4 records")
    summary.wait_for(timeout=60_000)
    assert "2 usable" in summary.text_content() and "2 invalid" in summary.text_content()
    invalid = app.locator("#invalid-list").text_content()
    assert "record 1" in invalid and "record 2" in invalid and "output" in invalid
    assert XSS in app.locator("#data-preview").text_content()  # shown as text...
    assert app.locator("#data-preview img").count() == 0        # ...never as HTML
    assert app.evaluate("() => window.__xss === undefined")


def test_bad_dataset_file_shows_error_and_app_stays_usable(app, tmp_path):
    bad = tmp_path / "broken.json"
    bad.write_text('[{"instruction": "x", ')
    app.get_by_label("Dataset file").set_input_files(str(bad))
    app.get_by_role("status").filter(has_text="not JSON").wait_for(timeout=60_000)
    app.get_by_role("button", name="Load demo dataset").click()
    app.locator("#data-summary", has_text="demo dataset").wait_for(timeout=60_000)


def _fill(page, **values):
    for name, val in values.items():
        page.locator(f"#settings [name={name}]").fill(str(val))
    page.locator("#settings [name=lr]").dispatch_event("change")


STEPS = 200


def test_train_demo_pause_resume_and_export(app, tmp_path):
    """The demo model and data train a few steps in the worker: the loss chart fills,
    Pause (pressed while step 3 is held) stops the run after that step, Resume goes on,
    the page stays responsive, the adapter downloads."""
    app.get_by_role("button", name="Load demo model").click()
    app.get_by_role("status").filter(has_text="Model loaded").wait_for(timeout=120_000)
    app.get_by_role("button", name="Load demo dataset").click()
    app.locator("#data-summary", has_text="usable").wait_for(timeout=60_000)
    _fill(app, max_steps=STEPS, micro_batch_size=1, grad_accum=1, cutoff_len=64, lr=0.003, warmup_steps=0,
          save_every=20)
    hold(app, 3)
    app.get_by_role("button", name="Train").click()
    held(app)
    app.locator("#train-progress-text", has_text="step 2 / ").wait_for(timeout=10_000)
    app.get_by_role("button", name="Pause").click()
    app.get_by_role("status").filter(has_text="Paused").wait_for(timeout=60_000)
    release(app)
    app.locator("#train-progress-text", has_text="step 3 / ").wait_for(timeout=60_000)
    app.wait_for_timeout(1000)
    assert "step 3 / " in app.locator("#train-progress-text").text_content()   # paused after step 3
    assert app.get_by_role("button", name="Resume").is_enabled()
    # while paused (and while training) the page answers at once
    t = app.evaluate("() => { const t0 = performance.now(); document.getElementById('prompt').value += ''; "
                     "return performance.now() - t0; }")
    assert t < 100
    app.screenshot(path=str(ARTIFACTS / "paused.png"), full_page=True)
    app.get_by_role("button", name="Resume").click()
    app.get_by_role("status").filter(has_text="finished").wait_for(timeout=600_000)
    assert f"step {STEPS} / {STEPS}" in app.locator("#train-progress-text").text_content()
    chart = app.locator("#chart-loss")
    assert chart.get_attribute("data-points") == str(STEPS)
    assert float(chart.get_attribute("data-last")) < float(chart.get_attribute("data-first")), "loss did not fall"
    app.screenshot(path=str(ARTIFACTS / "training-run.png"), full_page=True)
    with app.expect_download() as dl:
        app.get_by_role("button", name="Export adapter").click()
    saved = tmp_path / dl.value.suggested_filename
    dl.value.save_as(saved)
    assert saved.name in ("adapter_config.json", "adapter_model.safetensors")

"""The web app in headless Chromium: real worker, real Pyodide, real file inputs."""
import json
import pathlib
import re

import pytest

pytestmark = pytest.mark.browser   # headless Chromium: skipped by -m "not browser"

# Pause, Stop, Export, a reload, a NaN poison and a lost device must land while a run is
# going; a demo step now takes ~0.1-1.5 s on SwiftShader, so on a loaded machine one of
# them can miss its moment: such a test runs once more before it fails.
TIMING = pytest.mark.flaky(reruns=1)

ARTIFACTS = pathlib.Path(__file__).resolve().parent.parent / "test-artifacts"
ARTIFACTS.mkdir(exist_ok=True)

XSS = '<img src=x onerror="window.__xss = 1">'


@pytest.fixture
def app(browser_session):
    page = browser_session.new_page()
    page.set_viewport_size({"width": 1300, "height": 1600})
    page.goto(browser_session.server.url)
    page.locator("#kernel-result", has_text="y = [").wait_for(timeout=120_000)
    yield page
    page.close()


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


# enough steps that Pause lands in mid-run: a demo step at these settings takes ~0.1 s
# on SwiftShader with the CPU kernels
STEPS = 200


@TIMING
def test_train_demo_pause_resume_and_export(app, tmp_path):
    """The demo model and data train a few steps in the worker: the loss chart fills,
    Pause/Resume work, the page stays responsive, the adapter downloads."""
    app.get_by_role("button", name="Load demo model").click()
    app.get_by_role("status").filter(has_text="Model loaded").wait_for(timeout=120_000)
    app.get_by_role("button", name="Load demo dataset").click()
    app.locator("#data-summary", has_text="usable").wait_for(timeout=60_000)
    _fill(app, max_steps=STEPS, micro_batch_size=1, grad_accum=1, cutoff_len=64, lr=0.003, warmup_steps=0,
          save_every=20)
    app.get_by_role("button", name="Train").click()
    app.locator("#train-progress-text", has_text=re.compile(r"step \d+ /")).wait_for(timeout=300_000)
    app.get_by_role("button", name="Pause").click()
    app.get_by_role("status").filter(has_text="Paused").wait_for(timeout=300_000)
    # while paused (and while training) the page answers at once
    t = app.evaluate("() => { const t0 = performance.now(); document.getElementById('prompt').value += ''; "
                     "return performance.now() - t0; }")
    assert t < 100
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

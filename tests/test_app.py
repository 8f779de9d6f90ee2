"""The web app in headless Chromium: real worker, real Pyodide, real file inputs."""
import json

import pytest

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

"""The page as a new user meets it, in headless Chromium with real WebGPU (SwiftShader):
defaults that train with no load step, radios that show what is loaded, a status
line that says what to do next (point 1); Stop at a micro-batch boundary and Export
at any time once a step finished (3); progress within a step (2); the favicon, the
wide layout and the keyboard (6); fitting the settings to the device (4).
Screenshots land in test-artifacts/ (git-ignored)."""
import http.server
import re
import threading
import time

import pytest

from fixtures.make_tiny import TINY, make_hf
from test_app import ARTIFACTS, _fill, held, hold, release
from test_app_faults import messages, wait_for

pytestmark = pytest.mark.browser   # headless Chromium: skipped by -m "not browser"

FAST = dict(micro_batch_size=1, grad_accum=1, cutoff_len=64, lr=0.003, warmup_steps=0, save_every=0)


def open_page(session, width=1400, height=900):
    page = session.new_page()
    page.set_viewport_size({"width": width, "height": height})
    page.goto(session.server.url + "?test-hooks")
    page.get_by_role("status").filter(has_text="press Train").wait_for(timeout=120_000)
    return page


def checked(page, name):
    return page.evaluate("(n) => document.querySelector(`input[name=${n}]:checked`).value", name)


def shot(page, name):
    page.screenshot(path=str(ARTIFACTS / f"ux-{name}.png"), full_page=False)


def test_defaults_train_without_a_load_step_and_radios_follow_what_is_loaded(browser_session, tmp_path):
    """Open the page, press Train: the demo model and dataset load themselves and train.
    Then a dataset file and a model folder: each selects its own radio, the model is
    named after its folder, and the status says what to do next."""
    page = open_page(browser_session)
    try:
        status = page.get_by_role("status")
        assert "the demo model on the demo dataset" in status.text_content()
        assert checked(page, "model-source") == "demo" and checked(page, "data-source") == "demo"
        assert page.get_by_role("button", name="Train").is_enabled()
        shot(page, "1-opened")
        _fill(page, max_steps=2, **FAST)
        page.get_by_role("button", name="Train").click()
        status.filter(has_text="finished").wait_for(timeout=300_000)
        assert "Export adapter" in status.text_content()                       # says what is next
        assert page.locator("#chart-loss").get_attribute("data-points") == "2"
        assert "bitlora demo model" in page.locator("#model-info").text_content()
        assert "demo dataset" in page.locator("#data-summary").text_content()
        assert checked(page, "model-source") == "demo" and checked(page, "data-source") == "demo"
        shot(page, "1-trained-with-defaults")

        data = tmp_path / "mine.json"
        data.write_text('[{"instruction": "Say hi.", "input": "", "output": "hi"}]')
        page.get_by_label("Dataset file").set_input_files(str(data))
        status.filter(has_text="Dataset loaded").wait_for(timeout=60_000)
        assert checked(page, "data-source") == "file"
        assert "Press Train" in status.text_content()

        hf = make_hf(tmp_path / "my-bitnet", "online_f32", dims=dict(TINY, max_position_embeddings=256), seed=1)
        page.get_by_label("Model folder").set_input_files(str(hf))
        status.filter(has_text="Model loaded: my-bitnet").wait_for(timeout=120_000)
        assert checked(page, "model-source") == "folder"
        assert "on mine.json" in status.text_content(), status.text_content()
        shot(page, "1-folder-and-file")

        bad = tmp_path / "broken.json"
        bad.write_text("[{")
        page.get_by_label("Dataset file").set_input_files(str(bad))
        status.filter(has_text="not JSON").wait_for(timeout=60_000)
        assert checked(page, "data-source") == "file"                          # still what is loaded
        page.get_by_label("Built-in demo dataset").click()                    # the radio loads the demo
        status.filter(has_text=re.compile("Dataset loaded: 360")).wait_for(timeout=60_000)
        assert checked(page, "data-source") == "demo"
    finally:
        page.close()


def test_progress_within_a_step_stop_at_a_micro_batch_and_export_at_once(browser_session, tmp_path):
    """Micro-batch progress moves within 5 s of Train; Export is disabled with a reason
    until step 1, then downloads within 2 s while step 2 runs; Stop ends the run at the
    next micro-batch boundary and says so. The worker's test hold keeps step 1 at its
    third micro-batch, then step 2 at its second, while the test looks and acts."""
    page = open_page(browser_session)
    try:
        page.get_by_role("button", name="Load demo model").click()
        page.get_by_role("status").filter(has_text="Model loaded").wait_for(timeout=120_000)
        _fill(page, **dict(FAST, max_steps=4, grad_accum=4, micro_batch_size=4, cutoff_len=256))   # ~1.5 s steps
        export = page.get_by_role("button", name="Export adapter")
        assert export.is_disabled()
        assert page.locator("#export-why").is_visible()
        assert "first training step" in page.locator("#export-why").text_content()
        detail = page.locator("#train-detail")
        hold(page, 1, 2)
        page.get_by_role("button", name="Train").click()
        t0 = time.monotonic()
        first = detail.text_content()
        while detail.text_content() == first:                      # something visible moves
            assert time.monotonic() - t0 < 5, first
            page.wait_for_timeout(100)
        print(f"\nmoved after {time.monotonic() - t0:.1f} s: {first!r} -> {detail.text_content()!r}")
        held(page)
        page.locator("#train-detail", has_text="micro-batch 3 of 4").wait_for(timeout=10_000)
        text = detail.text_content()
        assert re.search(r"Step 1 of 4: micro-batch 3 of 4 · \d+ of \d+ tokens done · \d+ s since the step began",
                         text), text
        shot(page, "2-within-a-step")
        assert export.is_disabled()
        hold(page, 2, 1)                                           # step 1 goes on; step 2 waits
        held(page)
        page.locator("#chart-loss[data-points='1']").wait_for(timeout=10_000)   # the first point, now
        page.locator("#train-detail", has_text="Step 2 of 4: micro-batch 2 of 4").wait_for(timeout=10_000)
        assert export.is_enabled() and not page.locator("#export-why").is_visible()
        downloads = []
        page.on("download", lambda d: downloads.append(d))
        t0 = time.monotonic()
        export.click()
        while not downloads:
            assert time.monotonic() - t0 < 2, "no download within 2 s"
            page.wait_for_timeout(50)
        print(f"download after {time.monotonic() - t0:.2f} s while step 2 ran")
        ex = wait_for(page, "export", lambda m: True)
        assert ex["step"] == 1
        page.get_by_role("button", name="Stop").click()
        page.get_by_role("status").filter(has_text="Stopping after the current micro-batch").wait_for(timeout=10_000)
        shot(page, "3-stopping")
        release(page)
        t0 = time.monotonic()
        page.get_by_role("status").filter(has_text="Stopped after step").wait_for(timeout=120_000)
        print(f"stopped {time.monotonic() - t0:.1f} s after the release: {page.get_by_role('status').text_content()!r}")
        steps = [m["step"] for m in messages(page, "step")]
        assert steps == [1], steps                  # stopped inside step 2
        micros = [(m["step"], m["micro"]) for m in messages(page, "micro") if m["step"] == 2]
        assert micros == [(2, 0), (2, 1)], micros   # at the boundary after its second micro-batch
        assert "step 1 of 4" in page.get_by_role("status").text_content()
        assert export.is_enabled()
        shot(page, "3-stopped")
    finally:
        page.close()


def test_favicon_wide_layout_and_keyboard(browser_session):
    """No 404 on load (the favicon); at 1400 x 900 the settings, the training controls
    and the charts are on screen together; the page works from the keyboard."""
    page = browser_session.new_page()
    missing = []
    page.on("response", lambda r: missing.append(r.url) if r.status >= 400 else None)
    try:
        page.set_viewport_size({"width": 1400, "height": 900})
        page.goto(browser_session.server.url)
        page.get_by_role("status").filter(has_text="press Train").wait_for(timeout=120_000)
        assert missing == [], missing
        assert page.evaluate("() => document.querySelector('link[rel=icon]').href").endswith("favicon.svg")
        page.locator("#settings-h").scroll_into_view_if_needed()
        shot(page, "6-layout-1400")
        for sel in ("#settings-h", "#settings [name=lr]", "#train", "#stop", "#export", "#chart-loss",
                    "#chart-tps"):
            box = page.locator(sel).bounding_box()
            assert box and 0 <= box["y"] and box["y"] + min(box["height"], 40) <= 900 and box["x"] + 10 <= 1400, (sel, box)
        # keyboard: Tab reaches Train; Enter on a focused button acts; Escape closes the banner
        page.locator("body").focus()
        for i in range(80):
            page.keyboard.press("Tab")
            if page.evaluate("() => document.activeElement.id") == "train":
                break
        else:
            raise AssertionError("Tab never reached Train")
        print(f"\nTrain is Tab stop {i + 1}")
        page.locator("#load-demo-data").focus()
        page.keyboard.press("Enter")
        page.get_by_role("status").filter(has_text="Dataset loaded").wait_for(timeout=60_000)
        page.evaluate("() => { document.getElementById('banner').hidden = false; }")
        page.keyboard.press("Escape")
        assert page.locator("#banner").is_hidden()
    finally:
        page.close()


def test_fit_to_device_proposes_and_applies_settings_and_train_says_why(browser_session):
    """With a 12 MB budget the defaults (micro-batch 4: 17 MB on the demo data) do not fit:
    Train refuses before allocating anything and says why; Fit to device applies settings
    that fit (gradient checkpointing first), keeping the sequences per step."""
    page = open_page(browser_session)
    try:
        page.get_by_role("button", name="Load demo model").click()
        page.get_by_role("status").filter(has_text="Model loaded").wait_for(timeout=120_000)
        page.get_by_role("button", name="Load demo dataset").click()     # the estimate uses its longest example
        page.get_by_role("status").filter(has_text="Dataset loaded").wait_for(timeout=60_000)
        page.get_by_role("button", name="Reset to defaults").click()
        page.get_by_label("GPU memory budget (MB)").fill("12")
        page.get_by_label("GPU memory budget (MB)").dispatch_event("change")
        est = page.locator("#memory-estimate", has_text="Too big")
        est.wait_for(timeout=30_000)
        print("\n" + est.text_content())
        assert "over your budget of 12 MB" in est.text_content()
        page.get_by_role("button", name="Train").click()
        status = page.get_by_role("status").filter(has_text="not started")
        status.wait_for(timeout=60_000)
        assert "over your budget" in status.text_content()
        res = page.evaluate("() => bitloraTest.run('from bitlora import webapp\\nstr(webapp.S.trainer)', 30000)")
        assert res["ok"] and res["value"] == "None", res                  # nothing was set up
        shot(page, "4-does-not-fit")
        page.get_by_role("button", name="Fit to device").click()
        page.locator("#memory-estimate:not(.warning)").wait_for(timeout=30_000)
        mb = int(page.locator("#settings [name=micro_batch_size]").input_value())
        ga = int(page.locator("#settings [name=grad_accum]").input_value())
        assert page.locator("#settings [name=gradient_checkpointing]").is_checked()
        assert mb * ga >= 16, (mb, ga)
        assert page.get_by_role("button", name="Fit to device").is_hidden()
        shot(page, "4-fitted")
    finally:
        page.close()


class _Foreign(http.server.BaseHTTPRequestHandler):
    """Another origin: serves one dataset with CORS allowed, 404 for the rest."""
    def do_GET(self):  # noqa: N802
        body = b'[{"instruction": "Say hi.", "input": "", "output": "hi"}]'
        self.send_response(200 if self.path == "/data.json" else 404)
        self.send_header("Access-Control-Allow-Origin", "*")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def foreign():
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Foreign)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def test_a_foreign_origin_is_refused_with_a_reason_unless_allowed(browser_session, foreign):
    """A dataset URL on another origin: the page's CSP blocks it and the status says why
    and what to do; served with --allow-origin for that origin, it loads; an HTTP error
    says its status."""
    from bitlora.app.server import Server
    page = open_page(browser_session)
    try:
        page.get_by_label("Dataset URL").fill(foreign + "/data.json")
        page.get_by_label("Dataset URL").press("Enter")
        status = page.get_by_role("status").filter(has_text="could not fetch")
        status.wait_for(timeout=60_000)
        print("\n" + status.text_content())
        assert "--allow-origin" in status.text_content() and status.get_attribute("class") == "error"
        assert page.evaluate("() => document.querySelector('input[name=data-source]:checked').value") == "demo"
        shot(page, "5-origin-refused")
    finally:
        page.close()
    with Server(port=0, allow_origins=[foreign]) as allowed:
        page = browser_session.browser.new_page()
        try:
            page.goto(allowed.url)
            page.get_by_role("status").filter(has_text="press Train").wait_for(timeout=120_000)
            page.get_by_label("Dataset URL").fill(foreign + "/data.json")
            page.get_by_role("button", name="Load URL: dataset", exact=True).click()   # one button of that name
            page.get_by_role("status").filter(has_text="Dataset loaded: 1 usable").wait_for(timeout=60_000)
            assert page.evaluate("() => document.querySelector('input[name=data-source]:checked').value") == "url"
            page.get_by_label("Dataset URL").fill(foreign + "/missing.json")
            page.get_by_label("Dataset URL").press("Enter")
            page.get_by_role("status").filter(has_text="HTTP 404").wait_for(timeout=60_000)
        finally:
            page.close()


def _mimic_hub(root):
    """A server laid out like the Hub: /{repo}/resolve/{rev}/{file} redirects (302) to
    /cdn/{repo}/{file}, which serves the bytes (Range too) with CORS headers; the one
    repo is org/tiny, holding the files of `root`. `got` counts the file downloads."""
    got = []

    class Hub(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            parts = self.path.split("?")[0].strip("/").split("/")
            if len(parts) == 5 and parts[2] == "resolve" and parts[3] == "main":
                return self._send(302, b"", {"Location": f"/cdn/{parts[0]}/{parts[1]}/{parts[4]}"})
            path = root / parts[3] if len(parts) == 4 and parts[:3] == ["cdn", "org", "tiny"] else None
            if path is None or not path.is_file():
                return self._send(404, b"not found")
            body, code, extra = path.read_bytes(), 200, {"Accept-Ranges": "bytes"}
            rng = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range", ""))
            if rng:
                lo, hi = int(rng.group(1)), int(rng.group(2) or len(body) - 1)
                extra["Content-Range"] = f"bytes {lo}-{hi}/{len(body)}"
                body, code = body[lo:hi + 1], 206
            got.append(parts[-1])
            self._send(code, body, extra)

        def _send(self, code, body, headers=None):
            self.send_response(code)
            for k, v in {"Access-Control-Allow-Origin": "*", "Access-Control-Expose-Headers": "Content-Length",
                         "Content-Length": str(len(body)), **(headers or {})}.items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hub)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd, f"http://127.0.0.1:{httpd.server_address[1]}", got


def test_models_from_a_hub_by_repo_id_with_progress_and_the_browser_cache(browser_session, tmp_path):
    """A repo id against a local server laid out like the Hub (its base URL set in the
    page, its origin allowed by the server): byte progress, the model named after the
    repo; a reload loads it again from the browser's cache without downloading; Forget
    cached models frees it; a hub URL naming a GGUF file loads that file."""
    from bitlora.app.server import Server
    from fixtures.make_tiny import make_gguf
    hf = make_hf(tmp_path / "tiny", "online_f32", dims=dict(TINY, max_position_embeddings=256), seed=1)
    make_gguf(hf, hf / "tiny.gguf", "tq2_0")
    httpd, hub, got = _mimic_hub(hf)
    try:
        with Server(port=0, allow_origins=[hub]) as app:
            page = browser_session.browser.new_page()
            page.set_viewport_size({"width": 1400, "height": 900})

            def load(ref):
                page.locator("summary", has_text="Hub and cache").click() if not page.locator("#hub-url").is_visible() else None
                page.locator("#hub-url").fill(hub)
                page.get_by_label("Model URL").fill(ref)
                page.get_by_label("Model URL").press("Enter")

            try:
                page.goto(app.url + "?test-hooks")
                page.get_by_role("status").filter(has_text="press Train").wait_for(timeout=120_000)
                load("org/tiny")
                page.get_by_role("status").filter(has_text="Model loaded: org/tiny").wait_for(timeout=120_000)
                assert sorted(got) == ["config.json", "model.safetensors", "tokenizer.json"], got
                prog = [m for m in messages(page, "progress") if "model.safetensors" in (m.get("text") or "")]
                assert prog and prog[-1]["done"] == prog[-1]["total"] == (hf / "model.safetensors").stat().st_size
                assert page.evaluate("() => document.querySelector('input[name=model-source]:checked').value") == "url"
                shot(page, "5-hub-loaded")
                page.reload()
                page.get_by_role("status").filter(has_text="press Train").wait_for(timeout=120_000)
                load("org/tiny")
                page.get_by_role("status").filter(has_text="Model loaded: org/tiny").wait_for(timeout=120_000)
                assert len(got) == 3, got                                       # nothing downloaded again
                page.get_by_role("button", name="Forget cached models").click()
                page.get_by_role("status").filter(has_text="Cached models forgotten").wait_for(timeout=30_000)
                load(f"{hub}/org/tiny/blob/main/tiny.gguf")
                page.get_by_role("status").filter(has_text="Model loaded: org/tiny").wait_for(timeout=120_000)
                assert got[-1] == "tiny.gguf", got
                print(f"\ndownloads: {got}")
            finally:
                page.close()
    finally:
        httpd.shutdown()
        httpd.server_close()


class _Odd(http.server.BaseHTTPRequestHandler):
    """Another origin that fails in chosen ways: /status/<code>/<file> answers that HTTP
    status (with CORS allowed); /nocors/<file> answers 200 without a CORS header."""
    def do_GET(self):  # noqa: N802
        parts = self.path.strip("/").split("/")
        code = int(parts[1]) if parts[0] == "status" and parts[1].isdigit() else 200 if parts[0] == "nocors" else 404
        self.send_response(code)
        if parts[0] != "nocors":
            self.send_header("Access-Control-Allow-Origin", "*")
        self.send_header("Content-Length", "4")
        self.end_headers()
        self.wfile.write(b"GGUF")

    def log_message(self, *args):
        pass


def _serve(handler):
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd, f"http://127.0.0.1:{httpd.server_address[1]}"


def test_a_model_url_that_fails_says_why_in_the_page_and_the_page_goes_on(browser_session, foreign, tmp_path):
    """Model URLs that fail, each for its own reason: an origin the page's CSP blocks, a
    server without CORS headers, HTTP 404 and 500, no server at all, a repo id the hub
    (a local mimic) does not have. Each says why in the status line and beside the model,
    not only in the console; then the page loads the demo model and trains."""
    import socket
    from bitlora.app.server import Server
    odd, odd_url = _serve(_Odd)
    hf = make_hf(tmp_path / "tiny", "online_f32", dims=dict(TINY, max_position_embeddings=256), seed=1)
    hub_httpd, hub, _ = _mimic_hub(hf)
    with socket.socket() as s:          # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    cases = [  # (URL or repo id, words the page must say, screenshot name)
        (f"{foreign}/model.gguf", [f"Content-Security-Policy blocks {foreign}", f"--allow-origin {foreign}"], "csp"),
        (f"{odd_url}/nocors/model.gguf", ["does not let other sites' pages read it", "Access-Control-Allow-Origin"],
         "cors"),
        (f"{odd_url}/status/404/model.gguf", ["HTTP 404"], "404"),
        (f"{odd_url}/status/500/model.gguf", ["HTTP 500"], "500"),
        (f"{dead}/model.gguf", [f"no answer from {dead}", "network error"], "network"),
        ("org/nope", [f"{hub} has no repo org/nope with config.json at revision main", "HTTP 404"], "no-repo"),
    ]
    try:
        with Server(port=0, allow_origins=[odd_url, dead, hub]) as app:
            page = browser_session.browser.new_page()
            page.set_viewport_size({"width": 1400, "height": 900})
            try:
                page.goto(app.url + "?test-hooks")
                status = page.get_by_role("status")
                status.filter(has_text="press Train").wait_for(timeout=120_000)
                page.locator("summary", has_text="Hub and cache").click()
                page.locator("#hub-url").fill(hub)
                for url, words, name in cases:
                    page.get_by_label("Model URL").fill(url)
                    page.get_by_label("Model URL").press("Enter")
                    failed = status.filter(has_text="model: ")
                    failed.wait_for(timeout=60_000)
                    text = failed.text_content()
                    print(f"\n{name}: {text}")
                    assert failed.get_attribute("class") == "error", text
                    for w in words:
                        assert w in text, (w, text)
                    beside = page.locator("#model-progress-text").text_content()
                    assert beside.startswith("Not loaded: ") and words[0] in beside, beside
                    assert page.evaluate("() => document.querySelector('input[name=model-source]:checked').value") \
                        == "demo"                                          # nothing else was loaded
                    assert page.get_by_role("button", name="Train").is_enabled()
                    shot(page, f"5-model-url-{name}")
                    page.evaluate("() => { document.getElementById('status').textContent = ''; }")
                page.get_by_role("button", name="Load demo model").click()
                status.filter(has_text="Model loaded: bitlora demo model").wait_for(timeout=120_000)
                assert page.locator("#model-progress-text").text_content() == "Loaded."
                _fill(page, max_steps=1, **FAST)
                page.get_by_role("button", name="Train").click()
                status.filter(has_text="finished").wait_for(timeout=300_000)
            finally:
                page.close()
    finally:
        for httpd in (odd, hub_httpd):
            httpd.shutdown()
            httpd.server_close()
